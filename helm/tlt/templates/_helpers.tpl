{{- define "tlt.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tlt.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "ctx" $ "component" "rollout") */}}
{{- define "tlt.selector" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tlt.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "tlt.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "tlt.fullname" .)) -}}
{{- end -}}

{{- define "tlt.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:%d/0" (include "tlt.fullname" .) (int .Values.redis.port) -}}
{{- else -}}
{{- required "redis.external.url is required when redis.enabled is false" .Values.redis.external.url -}}
{{- end -}}
{{- end -}}

{{/* every TLT process: the settings ConfigMap, then the user's extraEnvFrom */}}
{{- define "tlt.settingsFrom" -}}
envFrom:
  - configMapRef:
      name: {{ include "tlt.fullname" . }}-settings
  {{- with .Values.extraEnvFrom }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* every TLT process: the user's extraEnv (inside an env list) */}}
{{- define "tlt.extraEnv" -}}
{{- with .Values.extraEnv }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/* a container that must not see the node's GPUs (the CUDA image says NVIDIA_VISIBLE_DEVICES=all,
     which the NVIDIA runtime honours for containers that request no GPU) */}}
{{- define "tlt.noGpu" -}}
- name: NVIDIA_VISIBLE_DEVICES
  value: void
{{- end -}}

{{/* pod metadata of a TLT workload: (dict "ctx" $ "component" "rollout") */}}
{{- define "tlt.podMetadata" -}}
annotations:
  {{- include "tlt.settingsChecksum" .ctx | nindent 2 }}
  {{- with .ctx.Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
labels:
  {{- include "tlt.labels" .ctx | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .ctx.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* scheduling of one workload: (dict "ctx" $ "c" <its values>) */}}
{{- define "tlt.scheduling" -}}
{{- with .ctx.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .c.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "tlt.placement" .c }}
{{- end -}}

{{/* the claim policy versions and runs go through with policyChannel disk */}}
{{- define "tlt.sharedClaim" -}}
{{- .Values.trainer.sharedVolume.existingClaim | default (printf "%s-shared" (include "tlt.fullname" .)) -}}
{{- end -}}

{{/* init containers that fill the model volume (read-write), e.g. a download; with freshDrafter
(rollout pods of model.draftPath "fresh") then one that writes an untrained drafter for the
policy, the same the drafter service registers as version 1 of a job without drafter_path */}}
{{- define "tlt.modelInit" -}}
{{- $ctx := .ctx }}
{{- if or $ctx.Values.model.initContainers .freshDrafter }}
initContainers:
  {{- range $ctx.Values.model.initContainers }}
  - {{- toYaml (merge (deepCopy .) (dict "volumeMounts" (list (dict "name" "models" "mountPath" $ctx.Values.model.mountPath)) "env" $ctx.Values.extraEnv "envFrom" $ctx.Values.extraEnvFrom "securityContext" $ctx.Values.securityContext)) | nindent 4 }}
  {{- end }}
  {{- if .freshDrafter }}
  - name: fresh-drafter
    image: {{ include "tlt.image" $ctx }}
    imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
    command: [python, -m, tlt.cli, drafter, fresh, --model, {{ $ctx.Values.model.path | quote }}, --out, {{ include "tlt.freshDrafterPath" $ctx | quote }}]
    volumeMounts:
      - {name: models, mountPath: {{ $ctx.Values.model.mountPath }}, readOnly: true}
      - {name: fresh-drafter, mountPath: /fresh-drafter}
    securityContext:
      {{- toYaml $ctx.Values.securityContext | nindent 6 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* where a rollout pod's fresh drafter lives (an emptyDir, filled by its init container) */}}
{{- define "tlt.freshDrafterPath" -}}
/fresh-drafter/v1
{{- end -}}

{{/* pods restart when the settings change */}}
{{- define "tlt.settingsChecksum" -}}
checksum/settings: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end -}}

{{/* every TLT process: the Redis password */}}
{{- define "tlt.redisEnv" -}}
- name: TLT_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tlt.secretName" . }}
      key: redis-password
{{- end -}}

{{- define "tlt.drafterTokenEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "tlt.secretName" .ctx }}
      key: drafter-token
{{- end -}}

{{- define "tlt.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "tlt.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* TLS (values tls.secretName): the Secret's files, where the settings point. */}}
{{- define "tlt.tlsDir" -}}/etc/tlt/tls{{- end }}

{{- define "tlt.tlsMount" -}}
{{- if .Values.tls.secretName }}
- {name: tls, mountPath: {{ include "tlt.tlsDir" . }}, readOnly: true}
{{- end }}
{{- end }}

{{- define "tlt.tlsVolume" -}}
{{- if .Values.tls.secretName }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
{{- end }}
{{- end }}

{{/* Kubelet's gRPC probes cannot speak TLS: with TLS on, the probes check the port is open. */}}
{{- define "tlt.grpcProbes" -}}
{{- $check := ternary (dict "tcpSocket" (dict "port" .port)) (dict "grpc" (dict "port" .port)) (ne .ctx.Values.tls.secretName "") }}
readinessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 10
livenessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 20
  failureThreshold: 6
{{- end }}

{{/* whether the trainer writes its runs to the shared volume: with the disk channel, or a claim given */}}
{{- define "tlt.trainerShared" -}}
{{- or (eq .Values.trainer.policyChannel "disk") (ne .Values.trainer.sharedVolume.existingClaim "") -}}
{{- end -}}
