"""What every TLT gRPC service is configured with (each service's settings extend it)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings


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
