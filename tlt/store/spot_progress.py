"""Each spot worker's progress, `tlt:{job}:spot:{worker}` (JSON, expiring): what it is doing and
how far its uncommitted training has come, for operators and for tests that must catch a worker
mid-slice (its lease is held only for a commit). The records present are also the job's live
workers, among which the samples are split."""

from __future__ import annotations

import time

import redis
from pydantic import BaseModel, Field

TTL_S = 120  # a worker that stopped writing (killed) leaves no record for long


class SpotProgress(BaseModel):
    """One worker's state: `training` inside a slice, `idle` between slices."""

    worker_id: str
    state: str = Field(pattern="^(training|idle)$")
    base_version: int = 0
    steps: int = Field(0, description="training steps since the base version")
    committed: int = Field(0, description="versions this worker committed")
    updated_at: float = Field(default_factory=time.time)


class SpotProgressBoard:
    """Write one worker's progress; read every worker's of a job."""

    def __init__(self, client: redis.Redis, job: str) -> None:
        self.client, self.prefix = client, f"tlt:{job}:spot:"

    def write(self, progress: SpotProgress) -> None:
        self.client.set(self.prefix + progress.worker_id, progress.model_dump_json(), ex=TTL_S)

    def remove(self, worker_id: str) -> None:
        """The worker stopped: its share of the samples goes to the others at once."""
        self.client.delete(self.prefix + worker_id)

    def read(self) -> list[SpotProgress]:
        keys = sorted(self.client.scan_iter(match=self.prefix + "*", count=100))
        values = self.client.mget(keys) if keys else []
        return [SpotProgress.model_validate_json(v) for v in values if v is not None]
