"""Validated requests of the drafter service: the single source of truth for its limits, used by
the gRPC layer (protobuf in, these models, the store) and by clients."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
LeaseId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
PathText = Annotated[str, StringConstraints(max_length=4096)]
MAX_LEASE_TTL_S = 3600


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegisterDrafterRequest(_Request):
    job_id: Name
    policy_path: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    base_drafter_path: PathText = ""


class DrafterRef(_Request):
    job_id: Name


class LeaseRequest(_Request):
    job_id: Name
    worker_id: Name
    ttl_seconds: int = Field(0, ge=0, le=MAX_LEASE_TTL_S)


class LeaseRef(_Request):
    lease_id: LeaseId
    job_id: Name


class CommitRequest(_Request):
    lease_id: LeaseId
    job_id: Name
    weights: bytes = Field(min_length=8)
    accept_length: float = Field(0.0, ge=0.0, le=1000.0)


class ExportRequest(_Request):
    job_id: Name
    version: int = Field(0, ge=0)


class WarmupRequest(_Request):
    job_id: Name
    dataset_path: PathText = ""
    epochs: int = Field(0, ge=0, le=1000)
    max_samples: int = Field(0, ge=0, le=100_000)
    eval_fraction: float = Field(0.0, ge=0.0, le=0.5)
