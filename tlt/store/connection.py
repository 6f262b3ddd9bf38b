"""How every TLT process reaches Redis: URL, password, TLS and retries, as one settings model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    import redis

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
