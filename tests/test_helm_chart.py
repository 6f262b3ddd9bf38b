"""The Helm chart, checked offline: `helm lint --strict`, renders with default values and with every
optional feature validated against the Kubernetes schemas of three versions, and assertions over the
rendered objects. Needs the helm binary of `make helm` (.tools/helm, or $TLT_HELM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tlt.local.cluster import DEFAULT_HISTORY_ARMS

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "tlt"
HELM = Path(os.environ.get("TLT_HELM", ROOT / ".tools" / "helm"))
KUBERNETES_VERSIONS = ("1.30.0", "1.32.0", "1.34.0")
EVERY_FEATURE = {
    "model.draftPath": "/models/drafter",
    "rollout.autoscaling.enabled": "true",
    "metrics.serviceMonitor.enabled": "true",
    "rollout.runtimeClassName": "nvidia",
    "trainer.runtimeClassName": "nvidia",
    "priorityClassName": "rl-high",
    "podAnnotations.team": "rl",
    "extraEnv[0].name": "NCCL_DEBUG",
    "extraEnv[0].value": "INFO",
    "extraEnvFrom[0].secretRef.name": "hf",
    "rollout.sglangArgs[0]": "--chunked-prefill-size",
    "rollout.sglangArgs[1]": "8192",
    "rollout.topologySpreadConstraints[0].maxSkew": "1",
    "rollout.topologySpreadConstraints[0].topologyKey": "kubernetes.io/hostname",
    "rollout.topologySpreadConstraints[0].whenUnsatisfiable": "ScheduleAnyway",
    "rollout.extraVolumes[0].name": "cache",
    "rollout.extraVolumes[0].emptyDir.medium": "Memory",
    "rollout.extraVolumeMounts[0].name": "cache",
    "rollout.extraVolumeMounts[0].mountPath": "/cache",
    "redis.nodeSelector.pool": "cpu",
    "model.volume.persistentVolumeClaim": "null",
    "model.volume.emptyDir.sizeLimit": "100Gi",
    "model.initContainers[0].name": "download",
    "model.initContainers[0].image": "python:3.11-slim",
    "model.initContainers[0].command[0]": "echo",
    "redis.persistence.enabled": "true",
    "trainer.policyChannel": "disk",
    "trainer.sharedVolume.existingClaim": "tlt-shared",
    "trainer.nodes": "2",
    "trainer.gpusPerNode": "8",
    "rollout.nodeSelector.gpu": "h200",
    "imagePullSecrets[0].name": "registry",
    "tls.secretName": "tlt-tls",
}
CRD_KINDS = ("ScaledObject", "ServiceMonitor")
FRESH_DRAFTER = {
    "model.draftPath": "fresh",
    "model.initContainers[0].name": "download",
    "model.initContainers[0].image": "python:3.11-slim",
    "model.initContainers[0].command[0]": "echo",
}
EXTERNAL_REDIS = {"redis.enabled": "false", "redis.external.url": "redis://redis.example:6379/0", "auth.existingSecret": "tlt-creds"}


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.fail(f"no helm binary at {HELM}: run `make helm`")
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, check=False, timeout=120)


def _render(values: dict[str, str] | None = None) -> list[dict]:
    sets = [f"--set={k}={v}" for k, v in (values or {}).items()]
    result = _helm("template", "rl", str(CHART), "--namespace", "tlt", *sets)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(objects: list[dict], kind: str, suffix: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return found


def _workload(objects: list[dict], suffix: str) -> dict:
    """The Deployment or StatefulSet (the trainer's) whose name ends with `suffix`."""
    (found,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet") and o["metadata"]["name"].endswith(suffix)]
    return found


def _tlt_workloads(objects: list[dict]) -> list[dict]:
    """The pods TLT's own image runs: every Deployment and the trainer's StatefulSet (not Redis)."""
    return [o for o in objects if o["kind"] == "Deployment" or (o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-trainer"))]


def _containers(deployment: dict) -> dict[str, dict]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def test_lint_strict() -> None:
    result = _helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "values", [{}, EVERY_FEATURE, FRESH_DRAFTER, EXTERNAL_REDIS], ids=["defaults", "every-feature", "fresh-drafter", "external-redis"]
)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_objects_are_valid_kubernetes(values: dict[str, str], version: str, tmp_path: Path) -> None:
    rendered = tmp_path / "rendered.yaml"
    # KEDA's and the Prometheus Operator's kinds are CRDs, which these schemas do not hold (their
    # fields are asserted in test_keda_scales_on_sglangs_queue_and_a_service_monitor_scrapes_it).
    objects = [o for o in _render(values) if o["kind"] not in CRD_KINDS]
    rendered.write_text(yaml.safe_dump_all(objects))
    command = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", version, str(rendered)]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rollout_pods_request_gpus_and_wait_long_before_readiness() -> None:
    rollout = _workload(_render(), "-rollout")
    server = _containers(rollout)["rollout-server"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1 and server["resources"]["requests"]["nvidia.com/gpu"] == 1
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/health" and startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "livenessProbe" not in server  # /health waits while a spot slice pauses the server
    assert rollout["spec"]["replicas"] == 2


def test_the_rollout_service_is_headless_and_names_the_port_the_trainer_looks_for() -> None:
    objects = _render()
    service = _one(objects, "Service", "-rollout")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["name"] == "http"
    settings = _one(objects, "ConfigMap", "-settings")["data"]
    assert settings["TLT_TRAINER_ROLLOUT_SERVICE"] == f"tlt/{service['metadata']['name']}"
    assert settings["TLT_TRAINER_ROLLOUT_PORT_NAME"] == "http"


def test_the_settings_configmap_names_only_real_settings_and_every_process_reads_it() -> None:
    """Each TLT_<PROCESS>_<FIELD> key is a field of that process's settings model (tlt/settings/)."""
    from tlt.settings.drafter_service import DrafterServiceSettings
    from tlt.settings.policy_follower import PolicyFollowerSettings
    from tlt.settings.rollout_server import RolloutServerSettings
    from tlt.settings.spot_worker import SpotWorkerSettings
    from tlt.settings.trainer import TrainerSettings
    from tlt.store.connection import RedisSettings

    models = (TrainerSettings, DrafterServiceSettings, SpotWorkerSettings, PolicyFollowerSettings, RedisSettings, RolloutServerSettings)
    by_prefix = {m.model_config["env_prefix"]: m for m in models}
    objects = _render({"trainer.policyChannel": "disk", "trainer.sharedVolume.existingClaim": "shared"})
    configmap = _one(objects, "ConfigMap", "-settings")
    for key in configmap["data"]:
        prefix = next(p for p in by_prefix if key.startswith(p))
        assert key.removeprefix(prefix).lower() in by_prefix[prefix].model_fields, key
    for workload in _tlt_workloads(objects):
        assert "checksum/settings" in workload["spec"]["template"]["metadata"]["annotations"]
        for container in _containers(workload).values():
            assert container["envFrom"] == [{"configMapRef": {"name": configmap["metadata"]["name"]}}]


def test_rbac_grants_exactly_list_and_watch_of_endpointslices() -> None:
    objects = _render()
    role = _one(objects, "Role", "-trainer")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]
    binding = _one(objects, "RoleBinding", "-trainer")
    trainer = _workload(objects, "-trainer")
    assert binding["subjects"][0]["name"] == trainer["spec"]["template"]["spec"]["serviceAccountName"]
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_pdb_covers_the_rollout_pods_and_updates_need_no_spare_gpu() -> None:
    objects = _render()
    pdb = _one(objects, "PodDisruptionBudget", "-rollout")
    rollout = _workload(objects, "-rollout")
    assert pdb["spec"]["selector"]["matchLabels"] == rollout["spec"]["selector"]["matchLabels"]
    # A surge pod would wait forever for a GPU on a full cluster.
    assert rollout["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert not [o for o in objects if o["kind"] in ("HorizontalPodAutoscaler", *CRD_KINDS)]


def test_keda_scales_on_sglangs_queue_and_a_service_monitor_scrapes_it() -> None:
    objects = _render({"rollout.autoscaling.enabled": "true", "rollout.autoscaling.maxReplicas": "6", "metrics.serviceMonitor.enabled": "true",
                       "metrics.serviceMonitor.labels.release": "prometheus"})  # fmt: skip
    rollout, service = _workload(objects, "-rollout"), _one(objects, "Service", "-rollout")
    scaled = _one(objects, "ScaledObject", "-rollout")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["spec"]["maxReplicaCount"] == 6
    assert scaled["spec"]["scaleTargetRef"]["name"] == rollout["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and "sglang:num_queue_reqs" in trigger["metadata"]["query"]
    assert service["metadata"]["name"] in trigger["metadata"]["query"] and trigger["metadata"]["threshold"] == "32"
    assert "replicas" not in rollout["spec"]  # KEDA owns it
    monitor = _one(objects, "ServiceMonitor", "-rollout")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert all(service["metadata"]["labels"][k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]


def test_gpu_pods_pin_their_device_and_no_other_container_sees_the_nodes_gpus() -> None:
    values = {"model.draftPath": "/models/drafter", "trainer.policyChannel": "redis", "rollout.spotWorker.placement": "sidecar"}
    objects = _render(values)
    settings = _one(objects, "ConfigMap", "-settings")["data"]
    assert settings["TLT_ROLLOUT_DEVICE"] == settings["TLT_TRAINER_DEVICE"] == "cuda" and settings["TLT_SPOT_DEVICE"] == "cpu"
    in_server = _one(_render({"model.draftPath": "/models/drafter"}), "ConfigMap", "-settings")["data"]
    assert in_server["TLT_SPOT_DEVICE"] == "cuda"  # the server's child trains on the server's GPU
    for suffix, container in (("-rollout", "spot-worker"), ("-rollout", "policy-follower"), ("-drafter", "drafter-service")):
        env = {e["name"]: e.get("value") for e in _containers(_workload(objects, suffix))[container]["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void", container
        assert "nvidia.com/gpu" not in str(_containers(_workload(objects, suffix))[container].get("resources"))
    for suffix, container in (("-rollout", "rollout-server"), ("-trainer", "trainer")):
        spec = _containers(_workload(objects, suffix))[container]
        assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in spec["env"]}
        assert spec["resources"]["limits"]["nvidia.com/gpu"] == 1
    shm = next(v for v in _workload(objects, "-rollout")["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}


def test_sglang_flags_go_after_the_double_dash_and_tlt_flags_before() -> None:
    values = {"rollout.extraArgs[0]": "--cpu-threads", "rollout.extraArgs[1]": "2", "rollout.sglangArgs[0]": "--chunked-prefill-size",
              "rollout.sglangArgs[1]": "8192"}  # fmt: skip
    args = _containers(_workload(_render(values), "-rollout"))["rollout-server"]["args"]
    split = args.index("--")
    assert args[split + 1 :] == ["--chunked-prefill-size", "8192"] and args.index("--cpu-threads") < split
    assert "--" not in _containers(_workload(_render(), "-rollout"))["rollout-server"]["args"]


def test_the_pods_carry_what_users_add_env_volumes_metadata_and_placement() -> None:
    objects = _render(EVERY_FEATURE)
    for workload in _tlt_workloads(objects):
        pod = workload["spec"]["template"]
        assert pod["metadata"]["annotations"]["team"] == "rl" and pod["spec"]["priorityClassName"] == "rl-high"
        for container in pod["spec"]["containers"]:
            assert {"name": "NCCL_DEBUG", "value": "INFO"} in container["env"], container["name"]
            assert {"secretRef": {"name": "hf"}} in container["envFrom"]
    rollout = _workload(objects, "-rollout")["spec"]["template"]["spec"]
    assert rollout["runtimeClassName"] == "nvidia" and rollout["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert {"name": "cache", "mountPath": "/cache"} in _containers(_workload(objects, "-rollout"))["rollout-server"]["volumeMounts"]
    (download,) = rollout["initContainers"]
    assert download["name"] == "download" and download["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    assert {"name": "models", "emptyDir": {"sizeLimit": "100Gi"}} in rollout["volumes"]
    assert _workload(objects, "-trainer")["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    redis = _one(objects, "StatefulSet", "-redis")["spec"]["template"]["spec"]
    assert redis["nodeSelector"] == {"pool": "cpu"}
    args = redis["containers"][0]["args"]
    assert args[args.index("--maxmemory") + 1] == "3gb" and args[args.index("--maxmemory-policy") + 1] == "noeviction"


def test_speculation_sidecars_and_policy_channel() -> None:
    plain = _containers(_workload(_render({"trainer.policyChannel": "redis"}), "-rollout"))
    assert set(plain) == {"rollout-server", "policy-follower"}  # no drafter: SD off, no spot worker
    server_args = plain["rollout-server"]["args"]
    assert server_args[server_args.index("--speculative") + 1] == "off"
    full = _containers(_workload(_render({"model.draftPath": "/models/drafter", "trainer.policyChannel": "redis"}), "-rollout"))
    # The spot worker is the server's child by default: the pod's GPU is visible to that container only.
    assert set(full) == {"rollout-server", "policy-follower"}
    args = full["rollout-server"]["args"]
    assert args[args.index("--speculative") + 1] == "adaptive" and args[args.index("--drafter-job") + 1] == "tlt-job"
    assert "--spot-worker" in args and "--spot-worker" not in server_args
    # History drafts beside EAGLE's, as `tlt run` has them; none without a drafter (SD off).
    assert json.loads(args[args.index("--history-arms") + 1]) == list(DEFAULT_HISTORY_ARMS)
    assert "--history-arms" not in server_args
    for values in ({"rollout.historyArms": "null"}, {"rollout.speculative": "always"}):
        args = _containers(_workload(_render({"model.draftPath": "/models/drafter", **values}), "-rollout"))["rollout-server"]["args"]
        assert "--history-arms" not in args, values
    env = {e["name"]: e for e in full["rollout-server"]["env"]}
    assert env["TLT_SPOT_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" and "TLT_SPOT_AUTH_TOKEN" in env
    values = {"model.draftPath": "/models/drafter", "trainer.policyChannel": "redis", "rollout.spotWorker.placement": "sidecar"}
    sidecar = _render(values)
    assert set(_containers(_workload(sidecar, "-rollout"))) == {"rollout-server", "spot-worker", "policy-follower"}
    assert "--spot-worker" not in _containers(_workload(sidecar, "-rollout"))["rollout-server"]["args"]
    assert _one(sidecar, "ConfigMap", "-settings")["data"]["TLT_SPOT_DEVICE"] == "cpu"
    disk = _render({"trainer.policyChannel": "disk", "trainer.sharedVolume.existingClaim": "shared"})
    assert "policy-follower" not in _containers(_workload(disk, "-rollout"))
    assert not [o for o in disk if o["kind"] == "PersistentVolumeClaim"]  # the user's claim is used


def test_a_fresh_drafter_is_written_in_each_rollout_pod_after_the_model_download() -> None:
    objects = _render(FRESH_DRAFTER)
    pod = _workload(objects, "-rollout")["spec"]["template"]["spec"]
    download, fresh = pod["initContainers"]  # the model first: the drafter is built from its config
    assert download["name"] == "download" and fresh["name"] == "fresh-drafter"
    command = fresh["command"]
    assert command[:6] == ["python", "-m", "tlt.cli", "drafter", "fresh", "--model"] and command[6] == "/models/policy"
    out = command[command.index("--out") + 1]
    server = _containers(_workload(objects, "-rollout"))["rollout-server"]
    args = server["args"]
    assert args[args.index("--draft-model-path") + 1] == out and args[args.index("--speculative") + 1] == "adaptive"
    assert "--spot-worker" in args
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    assert out.startswith(mounts["fresh-drafter"]["mountPath"] + "/") and mounts["fresh-drafter"]["readOnly"] is True
    assert {m["name"] for m in fresh["volumeMounts"]} == {"models", "fresh-drafter"}
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}["fresh-drafter"]
    trainer = _workload(objects, "-trainer")["spec"]["template"]["spec"]
    assert [c["name"] for c in trainer["initContainers"]] == ["download"]


def test_by_default_policies_go_through_a_shared_read_write_many_volume() -> None:
    """The Redis channel cannot carry a 7B policy; the default is the disk channel on a claim the
    chart creates (kept on uninstall), mounted read-only by every rollout pod."""
    objects = _render()
    claim = _one(objects, "PersistentVolumeClaim", "-shared")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    settings = _one(objects, "ConfigMap", "-settings")["data"]
    assert settings["TLT_TRAINER_POLICY_CHANNEL"] == "disk" and settings["TLT_TRAINER_POLICY_DIR"] == "/shared/policy"
    for suffix, read_only in (("-rollout", True), ("-trainer", False)):
        pod = _workload(objects, suffix)["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "shared")
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert volume["persistentVolumeClaim"].get("readOnly", False) is read_only


def test_external_redis_and_an_existing_secret() -> None:
    objects = _render(EXTERNAL_REDIS)
    assert not [o for o in objects if o["metadata"]["name"].endswith("-redis")]
    assert not [o for o in objects if o["kind"] == "Secret"]  # the user's Secret is used
    for deployment in _tlt_workloads(objects):
        for container in _containers(deployment).values():
            env = {e["name"]: e for e in container.get("env", [])}
            assert env["TLT_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "tlt-creds"
    assert _one(objects, "ConfigMap", "-settings")["data"]["TLT_REDIS_URL"] == "redis://redis.example:6379/0"


def test_credentials_come_from_a_secret_never_from_plain_values() -> None:
    objects = _render({"auth.redisPassword": "s3cret-pw", "auth.trainerToken": "tok"})
    secret = _one(objects, "Secret", "-auth")
    assert set(secret["data"]) == {"redis-password", "trainer-token", "drafter-token"}
    rendered_elsewhere = yaml.safe_dump_all([o for o in objects if o["kind"] != "Secret"])
    assert "s3cret-pw" not in rendered_elsewhere and "tok\n" not in rendered_elsewhere
    for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        for container in _containers(workload).values():
            for env in container.get("env", []):
                if any(word in env["name"] for word in ("PASSWORD", "TOKEN")):
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"], env


def test_tls_serves_both_grpc_services_and_their_clients_verify_with_the_ca() -> None:
    objects = _render(EVERY_FEATURE)
    settings = _one(objects, "ConfigMap", "-settings")["data"]
    assert settings["TLT_DRAFTER_TLS_CERT_FILE"] == settings["TLT_TRAINER_TLS_CERT_FILE"] == "/etc/tlt/tls/tls.crt"
    assert settings["TLT_TRAINER_DRAFTER_TLS_CA_FILE"] == settings["TLT_SPOT_TLS_CA_FILE"] == "/etc/tlt/tls/ca.crt"
    mounted = {"-drafter": "drafter-service", "-trainer": "trainer", "-rollout": "rollout-server"}  # its spot worker
    for suffix, container in mounted.items():
        pod = _workload(objects, suffix)["spec"]["template"]["spec"]
        assert {"name": "tls", "secret": {"secretName": "tlt-tls"}} in pod["volumes"]
        mounts = {m["name"]: m for m in _containers(_workload(objects, suffix))[container]["volumeMounts"]}
        assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/tlt/tls", "readOnly": True}
    for suffix, container in (("-drafter", "drafter-service"), ("-trainer", "trainer")):
        probes = _containers(_workload(objects, suffix))[container]
        assert "tcpSocket" in probes["readinessProbe"] and "grpc" not in probes["livenessProbe"]  # kubelet's gRPC probe has no TLS
    plain = _render()
    assert not any(k.endswith(("TLS_CERT_FILE", "TLS_CA_FILE")) for k in _one(plain, "ConfigMap", "-settings")["data"])
    assert "grpc" in _containers(_workload(plain, "-drafter"))["drafter-service"]["readinessProbe"]


def test_every_object_is_labelled_and_every_pod_runs_as_non_root() -> None:
    objects = _render(EVERY_FEATURE)
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "rl" and labels["app.kubernetes.io/name"] == "tlt", obj["metadata"]["name"]
    for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert _workload(objects, "-rollout")["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h200"}


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("rollout.speculative=sometimes", "/rollout/speculative"),
        ("rollout.port=0", "/rollout/port"),
        ("trainer.policyChannel=ftp", "/trainer/policyChannel"),
        ("job=bad name", "/job"),
        ("rollout.gpus=2", "additional properties"),
        ("redis.external.url=http://x", "/redis/external/url"),
        ("model.draftPath=fresher", "/model/draftPath"),
        ("rollout.historyArms={2,2}", "/rollout/historyArms"),
        ("rollout.historyArms={0}", "/rollout/historyArms"),
    ],
)
def test_the_schema_refuses_bad_values(setting: str, complaint: str) -> None:
    result = _helm("template", "rl", str(CHART), "--set", setting)
    assert result.returncode != 0 and complaint in result.stderr, result.stderr


def test_the_trainer_shards_over_its_pods_with_rank_0_serving() -> None:
    objects = _render({"trainer.nodes": "2", "trainer.gpusPerNode": "4", "trainer.sharedVolume.existingClaim": "shared"})
    trainer = _workload(objects, "-trainer")
    assert trainer["kind"] == "StatefulSet" and trainer["spec"]["replicas"] == 2
    assert trainer["spec"]["podManagementPolicy"] == "Parallel"
    ranks = _one(objects, "Service", "-trainer-ranks")
    assert trainer["spec"]["serviceName"] == ranks["metadata"]["name"]
    assert ranks["spec"]["clusterIP"] == "None" and ranks["spec"]["publishNotReadyAddresses"] is True
    container = _containers(trainer)["trainer"]
    command = container["command"]
    assert command[:3] == ["python", "-m", "torch.distributed.run"] and command[-2:] == ["-m", "trainer"]
    assert {"--nnodes=2", "--nproc-per-node=4", "--node-rank=$(TLT_NODE_RANK)", "--master-port=29500"} <= set(command)
    assert f"--master-addr={trainer['metadata']['name']}-0.{ranks['metadata']['name']}" in command
    env = {e["name"]: e for e in container["env"]}
    assert env["TLT_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["TLT_TRAINER_BROADCAST_ADDRESS"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # The job API reaches rank 0 only; the other pods answer health probes as followers.
    assert _one(objects, "Service", "-trainer")["spec"]["selector"]["apps.kubernetes.io/pod-index"] == "0"
    single = _containers(_workload(_render(), "-trainer"))["trainer"]
    assert single["command"] == ["python", "-m", "trainer"]
    settings = _one(objects, "ConfigMap", "-settings")["data"]
    assert settings["TLT_TRAINER_MIXED_PRECISION"] == "true" and settings["TLT_TRAINER_ACTIVATION_CHECKPOINTING"] == "false"
    # Sharded checkpoints need a volume every trainer pod mounts.
    refused = _helm("template", "rl", str(CHART), "--set=trainer.nodes=2", "--set=trainer.policyChannel=redis")
    assert refused.returncode != 0 and "trainer.nodes > 1 needs a volume" in refused.stderr
    distributed = _one(_render({"trainer.policyChannel": "distributed"}), "ConfigMap", "-settings")["data"]
    assert distributed["TLT_TRAINER_POLICY_CHANNEL"] == "distributed"
