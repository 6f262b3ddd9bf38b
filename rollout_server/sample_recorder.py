"""Every sequence a rollout server finishes goes to its job's `samples` stream in Redis: the
drafter's training data, token ids only."""

from __future__ import annotations

import logging
import os
import time
from collections import deque

from rollout_server.server_features import FEATURES_RID_PREFIX
from tlt.store.connection import RedisSettings
from tlt.store.samples_stream import SampleRecord, SamplesStream

logger = logging.getLogger(__name__)

SAMPLES_JOB_ENV = "TLT_SAMPLES_JOB"
_SEEN = 65536  # request ids remembered against double recording
_MAX_PENDING = 16384  # samples kept while Redis is unreachable
# Generations that are not rollouts: SGLang's /health check and the spot worker's feature prefills.
NOT_ROLLOUT_RID_PREFIXES = ("HEALTH_CHECK", FEATURES_RID_PREFIX)


class SampleRecorder:
    """Records finished requests once each, except aborted ones and non-rollouts. A Redis outage
    never stops serving: samples wait in a bounded buffer and go out once Redis is back."""

    def __init__(self, stream: SamplesStream, max_pending: int = _MAX_PENDING, retry_s: float = 1.0) -> None:
        self.stream, self.retry_s = stream, retry_s
        self._seen: set[str] = set()
        self._order: deque[str] = deque()
        self._pending: deque[SampleRecord] = deque(maxlen=max_pending)  # the oldest give way
        self._retry_at = 0.0
        self._last_error = 0.0

    def record_finished(self, reqs) -> int:
        """Queue the finished requests among `reqs` (SGLang `Req` objects) and send what is
        queued; returns how many samples reached Redis."""
        for req in reqs:
            if (
                not req.finished()
                or req.rid in self._seen
                or str(req.rid).startswith(NOT_ROLLOUT_RID_PREFIXES)
                or type(req.finished_reason).__name__ == "FINISH_ABORT"
            ):
                continue
            self._remember(req.rid)
            if len(self._pending) == self._pending.maxlen:
                logger.warning("TLT samples buffer full while Redis is away: the oldest sample is dropped")
            self._pending.append(SampleRecord(prompt_ids=list(req.origin_input_ids), output_ids=list(req.output_ids_through_stop)))
        return self.flush()

    def flush(self) -> int:
        """Send the queued samples (one transaction: all or none); returns how many were sent."""
        if not self._pending or time.monotonic() < self._retry_at:
            return 0
        records = list(self._pending)
        try:
            self.stream.add_many(records)
        except Exception:  # Redis down: keep them, try again in a while (the scheduler must not wait)
            self._retry_at = time.monotonic() + self.retry_s
            if time.monotonic() - self._last_error > 30:
                logger.exception("TLT could not record %d finished samples yet; keeping them", len(records))
                self._last_error = time.monotonic()
            return 0
        self._pending.clear()
        return len(records)

    def _remember(self, rid: str) -> None:
        self._seen.add(rid)
        self._order.append(rid)
        if len(self._order) > _SEEN:
            self._seen.discard(self._order.popleft())


def recorder_from_env() -> SampleRecorder | None:
    """A recorder for the job the launcher named (TLT_REDIS_* settings), else None."""
    job = os.environ.get(SAMPLES_JOB_ENV)
    # No retrying inside a call: the scheduler's loop calls it, and the recorder keeps what fails.
    return SampleRecorder(SamplesStream(RedisSettings(retry_s=0).client(), job)) if job else None
