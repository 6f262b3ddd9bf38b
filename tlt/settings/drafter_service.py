"""Settings of `python -m drafter_service`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from tlt.rpc.settings import GrpcServerSettings
from tlt.settings.common import process_flags


class DrafterServiceSettings(GrpcServerSettings):
    """Flags of `python -m drafter_service` (also `TLT_DRAFTER_*` variables; Redis: `TLT_REDIS_*`)."""

    model_config = process_flags("TLT_DRAFTER_", "python -m drafter_service")

    port: int = Field(50061, ge=1, le=65535, description="gRPC port")
    lease_ttl_s: int = Field(30, ge=1, le=3600, description="default lifetime of a spot-training lease")
    keep_versions: int = Field(5, ge=1, le=1000, description="drafter versions kept in Redis")
    max_message_bytes: int = Field(
        256 * 1024 * 1024, ge=1024 * 1024, le=2**31 - 1, description="largest gRPC message (a unary commit carries weights)"
    )
    max_commit_bytes: int = Field(
        8 * 1024**3, ge=1024 * 1024, le=64 * 1024**3, description="largest drafter a (streamed) commit may carry"
    )
    workers: int = Field(8, ge=1, le=256, description="gRPC worker threads")
    data_dir: Path | None = Field(
        None, description="Warmup reads datasets from under this directory only; unset: Warmup trains on samples streams"
    )
    threads: int = Field(1, ge=1, le=256, description="torch threads of Warmup training")
