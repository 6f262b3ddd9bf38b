"""What every TLT process's settings share: how flags are read, the device and dtype choices, and
how a service process starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Self, TypeVar

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tlt.store.connection import RedisSettings

if TYPE_CHECKING:
    import redis

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
Speculation = Literal["off", "always", "adaptive"]
PolicyChannel = Literal["disk", "redis", "distributed"]
# Job and worker names: they become Redis keys and Kubernetes label values.
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
Settings = TypeVar("Settings", bound=BaseSettings)


def process_flags(env_prefix: str, prog: str) -> SettingsConfigDict:
    """How every TLT process reads its flags: kebab-case CLI, `<prefix>*` environment variables."""
    return SettingsConfigDict(
        env_prefix=env_prefix, cli_prog_name=prog, cli_kebab_case=True, cli_implicit_flags=True, extra="forbid"
    )


def cuda_available() -> bool:
    """Whether a CUDA device is usable (imports torch lazily: the CLI must start fast)."""
    import torch

    return torch.cuda.is_available()


# NVIDIA's device nodes: present wherever a GPU is handed to this container or machine.
GPU_DEVICE_NODES = "/dev/nvidia[0-9]*"


def gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible as a device node, whether or not torch can use it."""
    import glob

    return bool(glob.glob(GPU_DEVICE_NODES))


def resolve_device(device: Device) -> Literal["cpu", "cuda"]:
    """The device to run on. `cuda` must be usable; `auto` is cuda when usable, and refuses to fall
    back to the CPU when a GPU is there that torch cannot use (e.g. a driver older than torch's
    CUDA build needs): serving a large model on the CPU in fp32 is never what was meant."""
    if device == "cpu":
        return "cpu"
    if cuda_available():
        return "cuda"
    import torch

    cuda = torch.version.cuda or "none"
    if device == "cuda":
        raise ValueError(
            f"device cuda: torch {torch.__version__} (built for CUDA {cuda}) sees no usable GPU; "
            "check the driver (CUDA 13.0 builds need 580 or newer) and the container's GPU request, or use device cpu"
        )
    if gpu_present():
        raise ValueError(
            f"device auto: a GPU is present ({GPU_DEVICE_NODES}) but torch {torch.__version__} (built for CUDA {cuda}) "
            "cannot use it, so nothing falls back to the CPU; fix the driver (CUDA 13.0 builds need 580 or newer) "
            "or say device cpu"
        )
    return "cpu"


def resolve_dtype(dtype: DType, device: Literal["cpu", "cuda"]) -> Literal["float32", "bfloat16", "float16"]:
    """The serving and publishing dtype: `auto` is float32 on the CPU (exact parity with HF) and
    bfloat16 on GPUs, never SGLang's own `auto`, which maps float32 configs (TLT writes them for CPU
    runs) to float16."""
    if dtype != "auto":
        return dtype
    return "float32" if device == "cpu" else "bfloat16"


class DeviceSettings(BaseSettings):
    """The device a process computes on and the dtype it serves or publishes weights in; each
    process's settings extend it (and may redescribe the two fields)."""

    device: Device = Field("auto", description="auto picks cuda when usable, else cpu (and refuses a GPU torch cannot use)")
    dtype: DType = Field("auto", description="auto: float32 on cpu, bfloat16 on cuda")

    @model_validator(mode="after")
    def _check_device(self) -> Self:
        self.resolved_device()  # a device that cannot be used is refused at start, saying why
        return self

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        """The device to run on (`resolve_device`)."""
        return resolve_device(self.device)

    def resolved_dtype(self) -> Literal["float32", "bfloat16", "float16"]:
        """The dtype on that device (`resolve_dtype`)."""
        return resolve_dtype(self.dtype, self.resolved_device())


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
