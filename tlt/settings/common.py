"""What every TLT process's settings share: how flags are read, the device and dtype choices, and
how a service process starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic_settings import BaseSettings, SettingsConfigDict

from tlt.store.connection import RedisSettings

if TYPE_CHECKING:
    import redis

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
Speculation = Literal["off", "always", "adaptive"]
PolicyChannel = Literal["disk", "redis"]
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
