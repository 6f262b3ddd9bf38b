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

{{/* every TLT process: the settings ConfigMap */}}
{{- define "tlt.settingsFrom" -}}
envFrom:
  - configMapRef:
      name: {{ include "tlt.fullname" . }}-settings
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
