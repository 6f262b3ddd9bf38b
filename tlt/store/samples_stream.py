"""The `samples` stream of DESIGN.md: finished rollouts (token ids only) that the drafter trains on,
in a Redis stream capped at about `maxlen` entries (older ones are trimmed first)."""

from __future__ import annotations

import time

import redis
from pydantic import BaseModel, Field, field_validator

MAX_SAMPLE_TOKENS = 1 << 20


class SampleRecord(BaseModel):
    """One finished rollout: what the drafter needs to recompute the policy's features."""

    prompt_ids: list[int] = Field(min_length=1, max_length=MAX_SAMPLE_TOKENS)
    output_ids: list[int] = Field(max_length=MAX_SAMPLE_TOKENS)
    policy_version: int | None = Field(None, ge=0)
    finished_at: float = Field(default_factory=time.time)

    @field_validator("prompt_ids", "output_ids")
    @classmethod
    def _token_ids(cls, ids: list[int]) -> list[int]:
        if any(i < 0 for i in ids):
            raise ValueError("token ids are non-negative")
        return ids


class SamplesStream:
    """Append and read one job's samples."""

    def __init__(self, client: redis.Redis, job: str, maxlen: int = 100_000) -> None:
        if not job or ":" in job or "{" in job:
            raise ValueError("job ids are non-empty and contain no ':' or '{'")
        if maxlen < 1:
            raise ValueError("maxlen must be positive")
        self.client, self.maxlen = client, maxlen
        self.key = f"tlt:{job}:samples"

    def add(self, record: SampleRecord) -> str:
        """Append a sample; returns its stream id."""
        entry_id = self.client.xadd(self.key, {"sample": record.model_dump_json()}, maxlen=self.maxlen, approximate=True)
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    def add_many(self, records: list[SampleRecord]) -> None:
        """Append several samples in one round trip, all or none (MULTI/EXEC)."""
        pipe = self.client.pipeline(transaction=True)
        for record in records:
            pipe.xadd(self.key, {"sample": record.model_dump_json()}, maxlen=self.maxlen, approximate=True)
        pipe.execute()

    def read(self, after: str = "0-0", count: int = 1000, block_ms: int | None = None) -> list[tuple[str, SampleRecord]]:
        """Up to `count` samples after stream id `after` (waiting up to `block_ms` for the first)."""
        answer = self.client.xread({self.key: after}, count=count, block=block_ms)
        records = []
        for _, entries in answer or []:
            for entry_id, fields in entries:
                raw = fields.get(b"sample", fields.get("sample"))
                records.append((entry_id.decode() if isinstance(entry_id, bytes) else entry_id, SampleRecord.model_validate_json(raw)))
        return records

    def latest(self, count: int) -> list[SampleRecord]:
        """The newest `count` samples, oldest first."""
        return [record for _, record in self.latest_entries(count)]

    def latest_entries(self, count: int) -> list[tuple[str, SampleRecord]]:
        """The newest `count` samples with their stream ids, oldest first."""
        entries = self.client.xrevrange(self.key, count=count)
        return [
            (entry_id.decode() if isinstance(entry_id, bytes) else entry_id, SampleRecord.model_validate_json(fields.get(b"sample", fields.get("sample"))))
            for entry_id, fields in reversed(entries)
        ]

    def last_id(self) -> str:
        """Stream id of the newest sample ("0-0" when empty)."""
        entries = self.client.xrevrange(self.key, count=1)
        if not entries:
            return "0-0"
        entry_id = entries[0][0]
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    def count_after(self, entry_id: str, limit: int) -> int:
        """How many samples came after `entry_id`, counting up to `limit`."""
        return len(self.client.xrange(self.key, min=f"({entry_id}", count=limit))

    def __len__(self) -> int:
        return int(self.client.xlen(self.key))
