"""Every sequence a rollout server finishes goes to its job's `samples` stream in Redis: the
drafter's training data, token ids only."""

from __future__ import annotations

import logging
import os
import time
from collections import deque

from rollout_server.server_features import FEATURES_RID_PREFIX
from tlt.samples_stream import SampleRecord, SamplesStream
from tlt.settings import RedisSettings

logger = logging.getLogger(__name__)

SAMPLES_JOB_ENV = "TLT_SAMPLES_JOB"
_SEEN = 65536  # request ids remembered against double recording
# Generations that are not rollouts: SGLang's /health check and the spot worker's feature prefills.
NOT_ROLLOUT_RID_PREFIXES = ("HEALTH_CHECK", FEATURES_RID_PREFIX)


class SampleRecorder:
    """Records finished requests once each, except aborted ones and non-rollouts; a Redis
    outage never stops serving."""

    def __init__(self, stream: SamplesStream) -> None:
        self.stream = stream
        self._seen: set[str] = set()
        self._order: deque[str] = deque()
        self._last_error = 0.0

    def record_finished(self, reqs) -> int:
        """Append the finished requests among `reqs` (SGLang `Req` objects); returns how many."""
        records = []
        for req in reqs:
            if (
                not req.finished()
                or req.rid in self._seen
                or str(req.rid).startswith(NOT_ROLLOUT_RID_PREFIXES)
                or type(req.finished_reason).__name__ == "FINISH_ABORT"
            ):
                continue
            self._remember(req.rid)
            records.append(SampleRecord(prompt_ids=list(req.origin_input_ids), output_ids=list(req.output_ids_through_stop)))
        if records:
            try:
                self.stream.add_many(records)
            except Exception:  # Redis down: these samples are lost to the drafter, not to the client
                if time.monotonic() - self._last_error > 30:
                    logger.exception("TLT could not record %d finished samples", len(records))
                    self._last_error = time.monotonic()
                return 0
        return len(records)

    def _remember(self, rid: str) -> None:
        self._seen.add(rid)
        self._order.append(rid)
        if len(self._order) > _SEEN:
            self._seen.discard(self._order.popleft())


def recorder_from_env() -> SampleRecorder | None:
    """A recorder for the job the launcher named (TLT_REDIS_* settings), else None."""
    job = os.environ.get(SAMPLES_JOB_ENV)
    return SampleRecorder(SamplesStream(RedisSettings().client(), job)) if job else None
