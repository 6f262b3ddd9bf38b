"""Settings of `python -m trainer`, the RL trainer and its job API."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from tlt.rpc.settings import GrpcServerSettings
from tlt.settings.common import Device, DeviceSettings, DType, PolicyChannel, process_flags


class TrainerSettings(GrpcServerSettings, DeviceSettings):
    """Flags of `python -m trainer` (also `TLT_TRAINER_*` variables; Redis: `TLT_REDIS_*`)."""

    model_config = process_flags("TLT_TRAINER_", "python -m trainer")

    port: int = Field(50051, ge=1, le=65535, description="gRPC port of the job API")
    rollout_servers: list[str] = Field(
        default_factory=list, description="base URLs of the rollout servers (static discovery), e.g. http://10.0.0.5:30000"
    )
    rollout_service: str | None = Field(
        None,
        pattern=r"^([a-z0-9-]{1,63}/)?[a-z0-9-]{1,63}$",
        description="[namespace/]name of the Kubernetes Service of the rollout pods: its EndpointSlices are watched "
        "(instead of --rollout-servers); namespace default: the pod's own",
    )
    rollout_port_name: str = Field("http", description="the rollout servers' port name in the EndpointSlices")
    rollout_port: int = Field(30000, ge=1, le=65535, description="their port when the slices name none")
    runs_dir: Path = Field(Path("runs"), description="jobs write <runs-dir>/<job>/checkpoints and policy versions here")
    policy_dir: Path | None = Field(
        None, description="where published policy versions go (must be readable by the rollout servers); "
        "unset: <runs-dir>/<job>/policy"
    )
    policy_channel: PolicyChannel = Field(
        "disk",
        description="how policy versions reach the servers: disk (a directory they read, --policy-dir), redis "
        "(the job's policy weight channel, applied by a policy follower beside each server; small policies) or "
        "distributed (broadcast over a torch.distributed group of the trainer and every server: NCCL on GPUs, gloo "
        "on the CPU)",
    )
    broadcast_address: str = Field(
        "127.0.0.1",
        description="distributed channel: the address the rollout servers reach this trainer at (its pod IP on a cluster)",
    )
    drafter_service: str | None = Field(None, description="host:port of the drafter service; unset: no adaptive drafter")
    drafter_auth_token: SecretStr | None = Field(None, description="bearer token of the drafter service")
    drafter_tls_ca_file: Path | None = Field(None, description="CA to verify the drafter service's TLS with; unset: plaintext")
    max_jobs: int = Field(1000, ge=1, le=1_000_000, description="job records kept; further submissions are refused")
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024, le=2**31 - 1, description="largest gRPC message")
    workers: int = Field(16, ge=2, le=256, description="gRPC worker threads (each WatchJob holds one)")
    threads: int = Field(1, ge=1, le=256, description="torch threads of the policy update on the CPU")
    device: Device = Field(
        "auto", description="where the policy update runs: auto picks cuda when usable (and refuses a GPU torch cannot use)"
    )
    dtype: DType = Field(
        "auto",
        description="dtype of the published policy versions (the servers serve them in it); auto: float32 on cpu, "
        "bfloat16 on cuda. Training keeps float32 master weights, with bf16 autocast on cuda",
    )
    mixed_precision: bool = Field(
        False, description="with several trainer ranks: bf16 compute and weight gathers, fp32 gradient reduction (GPUs)"
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward pass (less memory, more compute)"
    )
    lock_ttl_s: float = Field(
        15.0, ge=1.0, le=600.0, description="a trainer that stops renewing its Redis lock this long is taken over"
    )

    @field_validator("rollout_servers")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"rollout server {url!r} must be an http:// or https:// URL")
        return [u.rstrip("/") for u in urls]

    @model_validator(mode="after")
    def _one_discovery(self) -> TrainerSettings:
        if self.rollout_servers and self.rollout_service:
            raise ValueError("give --rollout-servers or --rollout-service, not both")
        return self
