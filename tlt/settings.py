"""Settings of TLT's processes: one pydantic model per process, the single source of truth for its
flags, defaults and limits. Each is filled from the command line, then `TLT_*` environment
variables, then the defaults."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tlt.adaptive.bandit import BanditConfig, SpecArm

if TYPE_CHECKING:
    import redis

Device = Literal["auto", "cpu", "cuda"]
Speculation = Literal["off", "always", "adaptive"]
PolicyChannel = Literal["disk", "redis"]
SPECULATIVE_MAX_RUNNING_REQUESTS = 1024
DType = Literal["auto", "float32", "bfloat16", "float16"]
Settings = TypeVar("Settings", bound=BaseSettings)


def _process_flags(env_prefix: str, prog: str) -> SettingsConfigDict:
    """How every TLT process reads its flags: kebab-case CLI, `<prefix>*` environment variables."""
    return SettingsConfigDict(
        env_prefix=env_prefix, cli_prog_name=prog, cli_kebab_case=True, cli_implicit_flags=True, extra="forbid"
    )


def cuda_available() -> bool:
    """Whether a CUDA device is usable (imports torch lazily: the CLI must start fast)."""
    import torch

    return torch.cuda.is_available()


class RolloutServerSettings(BaseSettings):
    """Flags of `python -m rollout_server`: SGLang with the TLT plugin and TLT's defaults.

    Arguments after `--` go to SGLang unchanged (see `sglang serve --help`).
    """

    model_config = _process_flags("TLT_ROLLOUT_", "python -m rollout_server")

    model_path: Path = Field(description="HF-format checkpoint directory (config, safetensors, tokenizer)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(30000, ge=1, le=65535, description="HTTP port")
    device: Device = Field("auto", description="auto picks cuda when a GPU is visible, else cpu")
    dtype: DType = Field("auto", description="weights/activations dtype; auto = float32 on cpu")
    max_total_tokens: int | None = Field(
        None, ge=256, description="KV-cache size in tokens; default 65536 on cpu, SGLang's on gpu"
    )
    max_running_requests: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="running batch cap; with speculation default 1024 (SGLang would cap it at 48, which "
        "throttles the bulk of a rollout batch: TLT speculates only in the tail)",
    )
    context_length: int | None = Field(None, ge=16, description="override the model's context length")
    mem_fraction_static: float | None = Field(
        None, gt=0.0, lt=1.0, description="GPU memory fraction for weights + KV cache (gpu only)"
    )
    random_seed: int | None = Field(None, ge=0, description="seed of SGLang's sampler")
    enable_return_hidden_states: bool = Field(
        False, description="allow return_hidden_states requests (implied by samples_job: its spot worker reads them)"
    )
    enable_memory_saver: bool = Field(
        False,
        description="on a GPU: let the spot worker release the KV cache while it trains (SGLang's memory saver)",
    )
    sleep_on_idle: bool = Field(
        True,
        description="an idle scheduler sleeps instead of spinning a core (SGLang's default spins), "
        "leaving idle time to spot training",
    )
    warmup: bool = Field(
        False,
        description="send SGLang's English warm-up request at start (off: TLT's tiny models have a "
        "character vocabulary that maps it to an empty prompt)",
    )
    speculative: Speculation = Field(
        "off",
        description="EAGLE speculative decoding: off; always (fixed draft steps/top-k); adaptive (TLT's "
        "bandit picks 0..draft-steps per decode step from measured accepted tokens/s)",
    )
    draft_model_path: Path | None = Field(None, description="SGLang EAGLE draft checkpoint (needed with speculation)")
    draft_steps: int = Field(4, ge=1, le=16, description="draft chain length; with adaptive, the longest arm")
    draft_topk: int = Field(1, ge=1, le=8, description="draft tree branching (always only; adaptive uses chains)")
    draft_tokens: int | None = Field(
        None, ge=2, le=64, description="tokens verified per step; default draft-steps + 1 (the whole chain)"
    )
    drafter_job: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="follow this job's drafter weight channel in Redis (TLT_REDIS_* settings) and swap "
        "new versions in between batches",
    )
    samples_job: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="append every finished sequence (token ids) to this job's samples stream in Redis",
    )
    enable_metrics: bool = Field(False, description="Prometheus metrics at /metrics (SGLang's and TLT's)")
    cpu_threads: int = Field(
        1,
        ge=1,
        le=256,
        description="torch threads of the CPU engine; 1 suits small models, whose ops are too small to "
        "repay thread synchronisation",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("warning", description="SGLang log level")
    sglang_args: list[str] = Field(
        default_factory=list, description="extra SGLang flags (on the command line: after `--`)"
    )

    @model_validator(mode="after")
    def _check_model_path(self) -> RolloutServerSettings:
        if not (self.model_path / "config.json").is_file():
            raise ValueError(f"model_path {self.model_path} has no config.json (expected an HF checkpoint)")
        return self

    @model_validator(mode="after")
    def _check_memory_saver(self) -> RolloutServerSettings:
        if self.enable_memory_saver and self.resolved_device() == "cpu":
            raise ValueError("enable_memory_saver needs a GPU (SGLang's memory release synchronises CUDA)")
        return self

    @model_validator(mode="after")
    def _check_speculation(self) -> RolloutServerSettings:
        if self.speculative == "off":
            if self.drafter_job is not None:
                raise ValueError("drafter_job needs speculation (a drafter to swap)")
            return self
        if self.draft_model_path is None or not (self.draft_model_path / "config.json").is_file():
            raise ValueError(f"speculative={self.speculative} needs draft_model_path with a config.json")
        if self.speculative == "adaptive" and (self.draft_topk != 1 or self.draft_tokens not in (None, self.draft_steps + 1)):
            raise ValueError("adaptive speculation switches chains: draft_topk must be 1 and draft_tokens unset")
        if self.draft_topk > 1 and self.draft_tokens is None:
            raise ValueError("a draft tree (draft_topk > 1) needs draft_tokens, the number of tokens to verify")
        if self.draft_topk == 1 and self.draft_tokens not in (None, self.draft_steps + 1):
            raise ValueError("a draft chain (draft_topk 1) verifies draft_steps + 1 tokens; leave draft_tokens unset")
        return self

    def bandit_config(self) -> BanditConfig:
        """The adaptive policy's configuration: one arm per draft length 0..draft_steps."""
        return BanditConfig(arms=[SpecArm(draft_steps=steps) for steps in range(self.draft_steps + 1)])

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        """The device to run on, with `auto` decided by whether CUDA is usable."""
        if self.device == "auto":
            return "cuda" if cuda_available() else "cpu"
        return self.device

    def sglang_argv(self, adaptive_config_path: Path | None = None) -> list[str]:
        """The SGLang command line these settings stand for; adaptive speculation needs the path of
        its config file (content: `rollout_server.adaptive_policy.adaptive_config_file`)."""
        device = self.resolved_device()
        argv = ["--model-path", str(self.model_path), "--host", self.host, "--port", str(self.port)]
        argv += ["--device", device, "--log-level", self.log_level]
        dtype = self.dtype
        if device == "cpu":
            # intel_amx runs on TLT's PyTorch attention ops here (and is SGLang's only CPU backend
            # with speculative verification); PyTorch sampling; fp32 for exact HF parity.
            # No graphs to capture on the CPU (adaptive speculation would otherwise try, per arm).
            argv += ["--attention-backend", "intel_amx", "--sampling-backend", "pytorch", "--disable-cuda-graph"]
            dtype = "float32" if dtype == "auto" else dtype
        argv += ["--dtype", dtype]
        max_total_tokens = self.max_total_tokens
        if max_total_tokens is None and device == "cpu":
            max_total_tokens = 65536
        optional = {
            "--max-total-tokens": max_total_tokens,
            "--max-running-requests": self.max_running_requests
            or (SPECULATIVE_MAX_RUNNING_REQUESTS if self.speculative != "off" else None),
            "--context-length": self.context_length,
            "--mem-fraction-static": self.mem_fraction_static,
            "--random-seed": self.random_seed,
        }
        for flag, value in optional.items():
            if value is not None:
                argv += [flag, str(value)]
        if self.enable_return_hidden_states or self.samples_job is not None:
            argv.append("--enable-return-hidden-states")
        if self.enable_memory_saver:
            argv.append("--enable-memory-saver")
        if self.sleep_on_idle:
            argv.append("--sleep-on-idle")
        if not self.warmup:
            argv.append("--skip-server-warmup")
        if self.enable_metrics:
            argv.append("--enable-metrics")
        return argv + self._speculative_argv(adaptive_config_path) + list(self.sglang_args)

    def _speculative_argv(self, adaptive_config_path: Path | None) -> list[str]:
        if self.speculative == "off":
            return []
        tokens = self.draft_tokens or self.draft_steps + 1
        argv = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(self.draft_model_path)]
        argv += ["--speculative-num-steps", str(self.draft_steps), "--speculative-eagle-topk", str(self.draft_topk)]
        argv += ["--speculative-num-draft-tokens", str(tokens)]
        if self.speculative == "adaptive":
            if adaptive_config_path is None:
                raise ValueError("adaptive speculation needs the path of its config file")
            argv += ["--speculative-adaptive", "--speculative-adaptive-config", str(adaptive_config_path)]
        return argv


_RETRY_EVERY_S = 0.25


class RedisSettings(BaseSettings):
    """How every TLT process reaches Redis (env `TLT_REDIS_URL`, `TLT_REDIS_PASSWORD`, ...)."""

    model_config = SettingsConfigDict(env_prefix="TLT_REDIS_", extra="forbid")

    url: str = Field("redis://127.0.0.1:6379/0", description="redis:// or rediss:// (TLS) URL")
    password: SecretStr | None = Field(None, description="AUTH password (kept out of the URL and logs)")
    tls_ca_file: Path | None = Field(None, description="CA bundle to verify the server with rediss://")
    socket_timeout_s: float = Field(30.0, gt=0, le=3600)
    retry_s: float = Field(
        10.0, ge=0, le=600, description="how long a call keeps retrying a lost connection (a Redis restarting); 0: fail at once"
    )

    @field_validator("url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("url must start with redis://, rediss:// or unix://")
        return url

    def client(self) -> redis.Redis:
        """A redis-py client (bytes in, bytes out) for these settings."""
        import redis
        from redis.backoff import ConstantBackoff
        from redis.retry import Retry

        extra: dict[str, object] = {}
        if self.url.startswith("rediss://") and self.tls_ca_file is not None:
            extra["ssl_ca_certs"] = str(self.tls_ca_file)
        return redis.Redis.from_url(
            self.url,
            password=self.password.get_secret_value() if self.password else None,
            socket_timeout=self.socket_timeout_s,
            # A restarted Redis refuses connections, then answers LOADING while it reads its file.
            retry=Retry(ConstantBackoff(_RETRY_EVERY_S), math.ceil(self.retry_s / _RETRY_EVERY_S)),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
            **extra,
        )


class GrpcServerSettings(BaseSettings):
    """What every TLT gRPC service is configured with; each service sets its own port and limits."""

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(50051, ge=1, le=65535, description="gRPC port")
    auth_token: SecretStr | None = Field(
        None, description="when set, every call must carry `authorization: Bearer <token>` metadata"
    )
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024, le=2**31 - 1, description="largest gRPC message")
    workers: int = Field(8, ge=1, le=256, description="gRPC worker threads")
    # TLS: both files, or neither (plaintext).
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain: serve gRPC over TLS")
    tls_key_file: Path | None = Field(None, description="PEM private key of the certificate")

    @model_validator(mode="after")
    def _both_or_neither(self):
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("give both --tls-cert-file and --tls-key-file, or neither")
        return self

    def tls(self) -> tuple[Path, Path] | None:
        return (self.tls_cert_file, self.tls_key_file) if self.tls_cert_file and self.tls_key_file else None


class DrafterServiceSettings(GrpcServerSettings):
    """Flags of `python -m drafter_service` (also `TLT_DRAFTER_*` variables; Redis: `TLT_REDIS_*`)."""

    model_config = _process_flags("TLT_DRAFTER_", "python -m drafter_service")

    port: int = Field(50061, ge=1, le=65535, description="gRPC port")
    lease_ttl_s: int = Field(30, ge=1, le=3600, description="default lifetime of a spot-training lease")
    keep_versions: int = Field(5, ge=1, le=1000, description="drafter versions kept in Redis")
    max_message_bytes: int = Field(
        256 * 1024 * 1024, ge=1024 * 1024, le=2**31 - 1, description="largest gRPC message (a commit carries weights)"
    )
    workers: int = Field(8, ge=1, le=256, description="gRPC worker threads")
    data_dir: Path | None = Field(
        None, description="Warmup reads datasets from under this directory only; unset: Warmup trains on samples streams"
    )
    threads: int = Field(1, ge=1, le=256, description="torch threads of Warmup training")


class SpotWorkerSettings(BaseSettings):
    """Flags of `python -m rollout_server.spot_worker` (also `TLT_SPOT_*`; Redis: `TLT_REDIS_*`)."""

    model_config = _process_flags("TLT_SPOT_", "python -m rollout_server.spot_worker")

    server_url: str = Field(description="the rollout server this worker sits beside, e.g. http://127.0.0.1:30000")
    drafter_service: str = Field(description="host:port of the drafter gRPC service")
    auth_token: SecretStr | None = Field(None, description="bearer token of the drafter service")
    tls_ca_file: Path | None = Field(None, description="CA to verify the drafter service's TLS with; unset: plaintext")
    job_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    worker_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="names this worker in leases and history")
    policy_path: Path = Field(
        description="HF checkpoint of the policy: the embeddings, LM head and rotary tables the drafter shares"
    )
    features: Literal["server", "local"] = Field(
        "server",
        description="where the policy's hidden states come from: the rollout server (needs "
        "--enable-return-hidden-states there, implied by --samples-job) or a local copy of the policy",
    )
    release_memory: Literal["auto", "on", "off"] = Field(
        "auto",
        description="pause the server and release its KV cache while a slice trains; auto: when the server "
        "runs with --enable-memory-saver (GPU)",
    )
    samples: int = Field(256, ge=8, le=100_000, description="newest samples trained on per slice")
    epochs: int = Field(2, ge=1, le=1000, description="passes over the samples per slice")
    lr: float = Field(
        2e-3,
        gt=0,
        le=1.0,
        description="AdamW learning rate of a slice; 2e-3 suits a fresh drafter, a converged one (e.g. after a "
        "warm-up) keeps its held-out accept length only at about 2e-4 (a fresh optimiser's first steps at 2e-3 "
        "undo some of it)",
    )
    min_new_samples: int = Field(32, ge=1, le=100_000, description="new samples needed before the next slice")
    idle_grace_s: float = Field(1.0, ge=0, le=3600, description="the server must stay idle this long first")
    poll_s: float = Field(0.2, gt=0, le=60, description="how often idleness is checked between slices")
    threads: int = Field(
        1,
        ge=1,
        le=256,
        description="torch threads for training on the CPU; more than the cores left free makes OpenMP "
        "spin against the rollout server (measured: the slice stalled until its neighbour went idle)",
    )


class TrainerSettings(GrpcServerSettings):
    """Flags of `python -m trainer` (also `TLT_TRAINER_*` variables; Redis: `TLT_REDIS_*`)."""

    model_config = _process_flags("TLT_TRAINER_", "python -m trainer")

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
        description="how policy versions reach the servers: disk (a directory they read, --policy-dir) or redis "
        "(the job's policy weight channel, applied by a policy follower beside each server; small policies)",
    )
    drafter_service: str | None = Field(None, description="host:port of the drafter service; unset: no adaptive drafter")
    drafter_auth_token: SecretStr | None = Field(None, description="bearer token of the drafter service")
    drafter_tls_ca_file: Path | None = Field(None, description="CA to verify the drafter service's TLS with; unset: plaintext")
    max_jobs: int = Field(1000, ge=1, le=1_000_000, description="job records kept; further submissions are refused")
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024, le=2**31 - 1, description="largest gRPC message")
    workers: int = Field(16, ge=2, le=256, description="gRPC worker threads (each WatchJob holds one)")
    threads: int = Field(1, ge=1, le=256, description="torch threads of the policy update on the CPU")
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


class PolicyFollowerSettings(BaseSettings):
    """Flags of `python -m rollout_server.policy_follower` (also `TLT_FOLLOWER_*`; Redis: `TLT_REDIS_*`)."""

    model_config = _process_flags("TLT_FOLLOWER_", "python -m rollout_server.policy_follower")

    server_url: str = Field(description="the rollout server this follower loads versions into")
    job_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    base_model_path: Path = Field(description="the server's initial checkpoint: config and tokenizer files come from it")
    work_dir: Path = Field(description="where versions are written for the server to load (the newest 2 kept)")
    max_bytes: int = Field(8 * 1024**3, ge=1024, description="largest policy blob accepted")


def service_start(settings_model: type[Settings], prog: str, argv: list[str] | None) -> tuple[Settings, redis.Redis]:
    """How a TLT service process starts: logging, its flags (exit with the problems when invalid),
    and a Redis client that answered a ping (fail at start, not at the first call)."""
    import logging
    import sys

    from pydantic import ValidationError
    from pydantic_settings import CliApp

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = CliApp.run(settings_model, cli_args=sys.argv[1:] if argv is None else argv)
        redis_settings = RedisSettings()
    except ValidationError as err:
        sys.exit(f"{prog}: invalid settings:\n{err}")
    client = redis_settings.client()
    client.ping()
    return settings, client
