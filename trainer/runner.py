"""Runs the trainer's jobs one at a time (they share the rollout servers): jobs a stopped trainer
left running resume first from their newest checkpoint, then queued jobs in order. One trainer per
Redis runs jobs (a Redis lock, renewed; a second trainer waits and takes over when the first stops
renewing it). Cancellation aborts the job's rollouts on the servers; stopping the trainer leaves the
running job RUNNING, to resume."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from redis.exceptions import RedisError

from tlt.jobs.records import JobRecord, JobState
from tlt.rollout.pool import RolloutPool
from tlt.rpc.errors import Cancelled
from tlt.settings.trainer import TrainerSettings
from tlt.store.update_window import UpdateWindow
from tlt.store.weight_channel import WeightChannel
from trainer.checkpoints import latest_checkpoint, read_state
from trainer.distributed import TrainerGroup
from trainer.drafter_link import DrafterLink
from trainer.job_store import JobStore
from trainer.loop import GrpoTrainer
from trainer.policy_publisher import DiskPolicyPublisher, PolicyPublisher, RedisPolicyPublisher
from trainer.training_state import ShardingOptions
from trainer.version_barrier import VersionBarrier
from trainer.weight_broadcast import BroadcastPolicyPublisher

logger = logging.getLogger(__name__)
LOCK_KEY = "tlt:trainer:lock"


class JobRunner:
    def __init__(
        self, store: JobStore, settings: TrainerSettings, discover: Callable[[], Sequence[str]], group: TrainerGroup | None = None
    ) -> None:
        """`group`: the trainer's ranks when it runs under torchrun (this is rank 0)."""
        self.store, self.settings, self.discover, self.group = store, settings, discover, group
        self.sharding = ShardingOptions(settings.mixed_precision, settings.activation_checkpointing)
        self.drafter = None
        if settings.drafter_service:
            self.drafter = DrafterLink(settings.drafter_service, settings.drafter_auth_token, tls_ca_file=settings.drafter_tls_ca_file)
        self._stop = threading.Event()
        self._lost_lock = threading.Event()
        self._lock = threading.Lock()
        self._current: tuple[str, RolloutPool] | None = None
        self._thread = threading.Thread(target=self._loop, name="job-runner", daemon=True)

    def start(self) -> JobRunner:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after aborting the current job's rollouts; the job stays RUNNING and resumes later."""
        self._stop.set()
        self._abort_current()
        self._thread.join(timeout_s)

    def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job (a running one stops at its next rollout request or step)."""
        record = self.store.request_cancel(job_id)
        with self._lock:
            running = self._current is not None and self._current[0] == job_id
        if running:
            self._abort_current()
        return record

    def _abort_current(self) -> None:
        with self._lock:
            current = self._current
        if current is not None:
            current[1].cancel()

    def _loop(self) -> None:
        lock = self.store.client.lock(LOCK_KEY, timeout=self.settings.lock_ttl_s, thread_local=False)
        while not self._stop.is_set():
            try:
                self._hold_and_run(lock)
            except RedisError as err:  # Redis restarting: the running job stays RUNNING, resumed later
                logger.error("Redis unavailable (%s); retrying", err)
                self._stop.wait(1.0)

    def _hold_and_run(self, lock) -> None:
        """While holding the trainer lock: resume interrupted jobs, then run queued ones."""
        if not lock.acquire(blocking=True, blocking_timeout=1.0):
            return
        logger.info("holding the trainer lock: running jobs")
        self._lost_lock.clear()
        renewer = threading.Thread(target=self._renew, args=(lock,), name="trainer-lock", daemon=True)
        renewer.start()
        try:
            for record in self.store.interrupted():
                if self._yielding():
                    break
                self._run(record)
            while not self._yielding():
                job_id = self.store.next_queued(timeout_s=1.0)
                if job_id is not None:
                    self._run(self.store.get(job_id))
        finally:
            self._lost_lock.set()  # ends the renewer
            renewer.join()
            try:
                lock.release()
            except RedisError:
                pass  # expired already, or Redis is away (then it expires)

    def _renew(self, lock) -> None:
        while not self._lost_lock.wait(self.settings.lock_ttl_s / 3):
            try:
                lock.reacquire()
            except RedisError as err:  # LockError included: another trainer may take over now
                logger.error("lost the trainer lock (%s): yielding the running job", err)
                self._lost_lock.set()
                self._abort_current()

    def _yielding(self) -> bool:
        return self._stop.is_set() or self._lost_lock.is_set()

    def _check_cancelled(self, job_id: str) -> None:
        if self._yielding() or self.store.cancel_requested(job_id):
            raise Cancelled(job_id)

    def _run(self, record: JobRecord) -> None:
        job, spec = record.job_id, record.spec
        if record.state.terminal:
            return
        if self.store.cancel_requested(job):
            self.store.transition(record, JobState.CANCELLED, "cancelled before it started")
            return
        root = self.settings.runs_dir / job
        # The record is the truth: a checkpoint written just before a crash (or a Redis outage) lost
        # the step's record is redone, so every step is recorded exactly once.
        checkpoint = latest_checkpoint(root / "checkpoints", at_most=record.steps_done)
        if record.state == JobState.RUNNING:  # interrupted: this is a resumption
            record.resumed += 1
        barrier = VersionBarrier(self._publisher(job, root))
        # Request ids differ per attempt: a killed trainer's requests may still be on the servers.
        pool = RolloutPool(self.discover, rid_prefix=f"{job}:{record.resumed}:", admit=barrier.admit)
        with self._lock:
            self._current = (job, pool)
        trainer = None
        try:
            self.store.transition(record, JobState.RUNNING, f"resuming from {checkpoint.name}" if checkpoint else "started")
            device = self.settings.resolved_device()
            window = UpdateWindow(self.store.client, job)
            trainer = GrpoTrainer(spec, pool, barrier, self.discover, checkpoint, device, self.group, self.sharding, window.marked)
            self._train(record, trainer, root, checkpoint)
            self.store.transition(record, JobState.SUCCEEDED, f"{spec.steps} steps done")
        except Cancelled:
            if self._yielding():
                logger.info("job %s left RUNNING at step %d: the trainer is stopping", job, record.steps_done)
            else:
                self.store.transition(record, JobState.CANCELLED, "cancelled by a client")
        except RedisError:
            raise  # not the job's fault: it stays RUNNING and resumes once Redis is back
        except Exception as err:  # a failing job must not take the trainer down
            logger.exception("job %s failed", job)
            self.store.transition(record, JobState.FAILED, f"{type(err).__name__}: {err}"[:2000])
        finally:
            if trainer is not None:
                trainer.close()
            if isinstance(barrier.publisher, BroadcastPolicyPublisher):
                barrier.publisher.close()
            with self._lock:
                self._current = None

    def _publisher(self, job: str, root: Path) -> PolicyPublisher:
        dtype = getattr(torch, self.settings.resolved_dtype())
        if self.settings.policy_channel == "distributed":
            backend = "nccl" if self.settings.resolved_device().startswith("cuda") else "gloo"
            return BroadcastPolicyPublisher(self.settings.broadcast_address, backend, dtype)
        if self.settings.policy_channel == "redis":
            return RedisPolicyPublisher(WeightChannel(self.store.client, job, "policy"), dtype=dtype)
        return DiskPolicyPublisher(self.settings.policy_dir / job if self.settings.policy_dir else root / "policy", dtype=dtype)

    def _train(self, record: JobRecord, trainer: GrpoTrainer, root: Path, checkpoint: Path | None) -> None:
        job, spec = record.job_id, record.spec
        next_step = read_state(checkpoint).next_step if checkpoint else 0
        if self.drafter is not None:
            self.drafter.register(spec)
        trainer.publish()
        if next_step == 0 and spec.eval_every:
            accuracy = trainer.evaluate(spec.eval_problems, temperature=spec.temperature)
            self.store.transition(record, JobState.RUNNING, f"held-out accuracy before training: {accuracy:.3f}", accuracy)
        for step in range(next_step, spec.steps):
            self._check_cancelled(job)
            started = time.monotonic()
            metrics = trainer.step(step)
            if self.drafter is not None:
                metrics.drafter_version = WeightChannel(self.store.client, job, "drafter").latest_version() or 0
            if spec.eval_every and ((step + 1) % spec.eval_every == 0 or step + 1 == spec.steps):
                metrics.eval_accuracy = trainer.evaluate(spec.eval_problems, temperature=spec.temperature)
            metrics.step_s = time.monotonic() - started
            path = trainer.checkpoint(root / "checkpoints", step + 1, metrics.drafter_version)
            self.store.step_done(record, metrics, str(path))
            logger.info("job %s step %d: reward %.3f in %.1f s", job, step, metrics.reward_mean, metrics.step_s)
