"""The trainer's jobs in Redis, so they survive a trainer restart: records (`tlt:{job}:job`, JSON),
the index (`tlt:jobs`, a sorted set by submission time), the queue (`tlt:jobs:queue`), a cancel flag
(`tlt:{job}:cancel`) and each job's event stream (`tlt:{job}:events`, read by WatchJob)."""

from __future__ import annotations

import time

import redis

from tlt.jobs.records import JobEvent, JobRecord, JobState, StepMetrics
from tlt.jobs.spec import JobSpec
from tlt.rpc.errors import AlreadyExists, NotFound, ResourceExhausted

INDEX = "tlt:jobs"
QUEUE = "tlt:jobs:queue"
EVENTS_MAXLEN = 100_000


def _record_key(job_id: str) -> str:
    return f"tlt:{job_id}:job"


def _events_key(job_id: str) -> str:
    return f"tlt:{job_id}:events"


def _add_event(pipe: redis.client.Pipeline, event: JobEvent) -> None:
    """Append the event inside the caller's transaction, beside the change it reports."""
    data = event.model_dump_json(exclude={"event_id"})
    pipe.xadd(_events_key(event.job_id), {"event": data}, maxlen=EVENTS_MAXLEN, approximate=True)


def _cancel_key(job_id: str) -> str:
    return f"tlt:{job_id}:cancel"


class JobStore:
    """Job records, queue and events. Records of running jobs are written by the runner only;
    clients' cancellations go through the separate flag, so neither overwrites the other."""

    def __init__(self, client: redis.Redis, max_jobs: int = 1000) -> None:
        self.client, self.max_jobs = client, max_jobs

    def submit(self, spec: JobSpec) -> JobRecord:
        """Persist and queue a new job; ALREADY_EXISTS for a known id, RESOURCE_EXHAUSTED past max_jobs."""
        if self.client.zcard(INDEX) >= self.max_jobs:
            raise ResourceExhausted(f"{self.max_jobs} jobs are stored already (the trainer's --max-jobs)")
        record = JobRecord(job_id=spec.name, spec=spec, created_at=time.time())
        if not self.client.set(_record_key(spec.name), record.model_dump_json(), nx=True):
            raise AlreadyExists(f"job {spec.name!r} exists already: pick another name")
        with self.client.pipeline() as pipe:
            pipe.zadd(INDEX, {spec.name: record.created_at})
            pipe.rpush(QUEUE, spec.name)
            _add_event(pipe, JobEvent(job_id=spec.name, time=record.created_at, state=JobState.QUEUED, message="submitted"))
            pipe.execute()
        return record

    def get(self, job_id: str) -> JobRecord:
        raw = self.client.get(_record_key(job_id))
        if raw is None:
            raise NotFound(f"no job {job_id!r}")
        return JobRecord.model_validate_json(raw)

    def list(self, state: JobState | None = None, limit: int = 100) -> list[JobRecord]:
        """Newest first."""
        records = []
        for job_id in self.client.zrevrange(INDEX, 0, -1):
            raw = self.client.get(_record_key(job_id.decode()))
            if raw is None:
                continue
            record = JobRecord.model_validate_json(raw)
            if state is None or record.state == state:
                records.append(record)
                if len(records) >= limit:
                    break
        return records

    def transition(self, record: JobRecord, state: JobState, message: str = "", eval_accuracy: float = -1.0) -> None:
        """Move a job to `state`, persist it and append the state change to its events."""
        now = time.time()
        record.state, record.message = state, message
        if state == JobState.RUNNING and not record.started_at:
            record.started_at = now
        if state.terminal:
            record.finished_at = now
            self.client.delete(_cancel_key(record.job_id))
        event = JobEvent(job_id=record.job_id, time=now, state=state, message=message, steps_done=record.steps_done)
        event.eval_accuracy = eval_accuracy
        self._save_with_event(record, event)

    def step_done(self, record: JobRecord, metrics: StepMetrics, checkpoint: str) -> None:
        record.steps_done, record.last_step, record.checkpoint = metrics.step + 1, metrics, checkpoint
        self._save_with_event(record, JobEvent(job_id=record.job_id, time=time.time(), step=metrics))

    def _save_with_event(self, record: JobRecord, event: JobEvent) -> None:
        """The record and its event in one transaction: a crash leaves both or neither."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.set(_record_key(record.job_id), record.model_dump_json())
            _add_event(pipe, event)
            pipe.execute()

    def request_cancel(self, job_id: str) -> JobRecord:
        """Cancel a job: a queued one at once, a running one at its runner's next check. Idempotent."""
        record = self.get(job_id)
        if record.state.terminal:
            return record
        self.client.set(_cancel_key(job_id), b"1")
        if self.client.lrem(QUEUE, 0, job_id):  # still queued: no runner will see it
            self.transition(record, JobState.CANCELLED, "cancelled before it started")
        return self.get(job_id)

    def cancel_requested(self, job_id: str) -> bool:
        return bool(self.client.exists(_cancel_key(job_id)))

    def next_queued(self, timeout_s: float) -> str | None:
        """Take the next queued job id, waiting up to `timeout_s`."""
        popped = self.client.blpop([QUEUE], timeout=timeout_s)
        return popped[1].decode() if popped else None

    def interrupted(self) -> list[JobRecord]:
        """Jobs left RUNNING by a trainer that stopped (oldest first): they resume first. Queued jobs
        a stopped trainer had taken off the queue but not started go back to its head."""
        for record in self.list(JobState.QUEUED, limit=self.max_jobs):
            if self.client.lpos(QUEUE, record.job_id) is None:
                self.client.lpush(QUEUE, record.job_id)
        return sorted(self.list(JobState.RUNNING, limit=self.max_jobs), key=lambda r: r.created_at)

    def events(self, job_id: str, after: str = "0-0", block_ms: int = 1000) -> list[JobEvent]:
        """The job's events after stream id `after`, waiting up to `block_ms` for the first."""
        answer = self.client.xread({_events_key(job_id): after or "0-0"}, count=1000, block=block_ms)
        events = []
        for _, entries in answer or ():
            for event_id, fields in entries:
                event = JobEvent.model_validate_json(fields[b"event"])
                event.event_id = event_id.decode()
                events.append(event)
        return events
