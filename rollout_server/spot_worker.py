"""The spot worker beside a rollout server: while its server is idle it carries the job's
drafter training on (`tlt.drafter.continual`): features of new samples, training steps, a paired
measure against the published version. A generation request arriving at the server preempts the
slice within one unit of work (a training micro-step, a held-out sequence, a batch of features),
and everything the slice did is kept for the next idle gap.

A candidate that beats the published version by more than the measure's noise is committed as
the next version under a lease of the drafter service, held only for the commit. Several
workers of one job therefore train at once, each on its own idle server; when another one
committed first, a worker rebases: its uncommitted change is added onto the newest version (as
a rebased patch), measured against that version, and committed if it still wins.

Features (the policy's last hidden states) come from the rollout server itself
(`server_features`, before the slice trains); the worker then holds only the parts the drafter
shares with the policy (embedding, LM head, rotary), read tensor by tensor from the served
checkpoint in the serving dtype, on the worker's device: on a GPU pod, the GPU its idle server
hands over. A local transformers copy of the whole policy is the fallback feature source.
While it trains, a server with a memory saver (GPU) is paused with its KV cache handed over
(`memory_handoff`); requests arriving meanwhile wait there, count as load, and preempt the slice.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import grpc
import requests
import torch
from pydantic import BaseModel, Field
from redis.exceptions import RedisError
from safetensors.torch import save as save_blob
from transformers import AutoConfig, AutoModelForCausalLM

from rollout_server.memory_handoff import (
    HandOffMarker,
    MemoryHandOff,
    ServerBusy,
    memory_saver_enabled,
    recover_hand_off,
)
from rollout_server.server_features import FeaturesUnavailable, ServerFeatures
from tlt.drafter.continual import (
    ContinualConfig,
    ContinualTraining,
    Sample,
    Verdict,
    sample_owner,
)
from tlt.drafter.model import PolicyParts
from tlt.drafter.slice import training_sequence
from tlt.drafter.training import DrafterTrainingConfig, policy_features
from tlt.rollout.client import model_info, server_load
from tlt.rpc.drafter_client import commit
from tlt.store.samples_stream import SamplesStream
from tlt.store.spot_progress import SpotProgress, SpotProgressBoard
from tlt.store.update_window import UpdateSlots
from tlt.store.weight_channel import BadBlob, WeightChannel
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc

logger = logging.getLogger(__name__)
OUTAGE_BACKOFF_S = 2.0  # between tries while Redis or the drafter's latest version is unusable
HEARTBEAT_S = 30.0  # between two progress records of an idle worker (they expire after TTL_S)


def spot_training(epochs: int, lr: float = 1e-4) -> DrafterTrainingConfig:
    """Drafter training in small micro-steps: the worker gives the machine back between two."""
    return DrafterTrainingConfig(epochs=epochs, lr=lr, tokens_per_row=512, rows_per_step=1)


class SpotWorkerConfig(BaseModel):
    """What one spot worker trains, on what, and how often it looks up."""

    job_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    worker_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    policy_path: str
    samples: int = Field(512, ge=8, le=100_000, description="the training window: the job's newest samples")
    features_per_request: int = Field(16, ge=1, le=1024, description="sequences per feature computation")
    features_tokens: int = Field(
        2048, ge=1, description="tokens per feature computation (SGLang returns a chunked prefill's hidden states short)"
    )
    training: DrafterTrainingConfig = Field(default_factory=lambda: spot_training(epochs=2))
    continual: ContinualConfig = Field(default_factory=ContinualConfig)
    idle_grace_s: float = Field(0.25, ge=0, description="the server must stay idle this long first")
    min_new_samples: int = Field(32, ge=1, description="new samples that wake a worker whose data is used up")
    split_samples: bool = Field(
        True,
        description="train on this worker's share of the window only (split by sample id among the job's workers "
        "on the progress board), so no two workers compute the same features or repeat each other's steps; "
        "every worker measures on all the held-out samples",
    )
    seed: int = 0


class Preempted(Exception):
    """The rollout server got work: the slice stops."""


class NoSamples(Exception):
    """Too few samples in the stream to train on yet."""


@dataclass
class SliceResult:
    """What one slice did: committed a version, or was preempted (and how fast it let go).
    The accept lengths are those of the slice's last measure, base and candidate paired."""

    base_version: int
    version: int | None = None
    accept_length_before: float = 0.0
    accept_length: float = 0.0
    gain_standard_error: float = 0.0
    sequences: int = 0  # held-out sequences the last measure compared on
    measures: int = 0
    steps: int = 0  # training steps in this slice
    total_steps: int = 0  # ... the candidate has had since its base
    features: int = 0  # samples whose features this slice computed
    preempted: bool = False
    preempt_latency_s: float | None = None  # from the server turning busy to the slice stopping
    started_at: float = 0.0  # time.monotonic() when the lease was granted
    ended_at: float = 0.0  # ... and when the slice let go of it


def wait_for_server(server_url: str, poll_s: float = 2.0) -> None:
    """Until the server answers (a worker starts beside it, as a sidecar or its child). `/v1/loads`,
    not `/health`: that one generates, and waits forever on a server a killed worker left paused."""
    while True:
        try:
            server_load(server_url)
            return
        except requests.RequestException:
            time.sleep(poll_s)


def served_model_path(server_url: str) -> str:
    """The checkpoint the SGLang server serves now (moved by `/update_weights_from_disk`)."""
    return model_info(server_url).get("model_path", "")


class SpotWorker:
    """Runs slices on one rollout server's idle time."""

    def __init__(
        self,
        config: SpotWorkerConfig,
        channel: WeightChannel,
        samples: SamplesStream,
        stub: drafter_pb2_grpc.DrafterServiceStub,
        busy: Callable[[], bool],
        metadata: tuple[tuple[str, str], ...] = (),
        features: Callable[[list[list[int]]], list[torch.Tensor]] | None = None,
        hand_off: Callable[[], AbstractContextManager] = nullcontext,
        policy_source: Callable[[], str] | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        update_slots: UpdateSlots | None = None,
    ) -> None:
        """`features`: the policy's features of token sequences (e.g. `ServerFeatures.many`; default:
        the local policy copy);
        `hand_off`: a context the slice trains in (e.g. `MemoryHandOff`);
        `policy_source`: where the policy now being served lives (e.g. `served_model_path`): the
        drafter's embedding and head follow it when the trainer publishes a new version;
        `device`, `dtype`: where the drafter trains, and the dtype of the borrowed parts (the serving one);
        `update_slots`: inside the trainer's update window the worker works only while it holds one."""
        self.config, self.channel, self.samples, self.stub = config, channel, samples, stub
        self.busy, self.metadata, self.hand_off, self.update_slots = busy, metadata, hand_off, update_slots
        self.policy_source = policy_source
        self.device, self.dtype, self.local_features = torch.device(device), dtype, features is None
        self.policy_path = ""
        self._load_policy(config.policy_path)
        self.features = features or (lambda sequences: [policy_features(self.policy, ids) for ids in sequences])
        self.training = ContinualTraining(self.policy_config, config.continual, config.training, self.device)
        self._last_seen = "0-0"  # newest sample id in the training window
        self._stop = threading.Event()
        self._busy_since: float | None = None
        self._ready: Verdict | None = None  # a measure that said commit, not committed yet
        self.progress = SpotProgressBoard(samples.client, config.job_id)
        self._posted_at = 0.0  # time.monotonic() of the last progress record
        self.committed = 0

    def _load_policy(self, path: str) -> None:
        self.policy_config = AutoConfig.from_pretrained(path)
        if self.local_features:
            self.policy = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype).to(self.device).eval()
            self.parts = PolicyParts(self.policy)
        else:
            self.parts = PolicyParts.from_checkpoint(Path(path), str(self.device), self.dtype)
        self.policy_path = path

    def _follow_policy(self) -> None:
        """Reload the policy when the server serves another one (a published policy version)."""
        if self.policy_source is None:
            return
        served = self.policy_source()
        if served and served != self.policy_path and Path(served, "config.json").is_file():
            logger.info("spot worker: the server now serves %s; reloading the policy's shared parts", served)
            self._load_policy(served)

    def _check(self) -> None:
        """Between two units of work: raise Preempted when the server has work."""
        if time.monotonic() - self._posted_at > HEARTBEAT_S:  # a long slice stays on the board
            self._post("training")
        if self._busy():
            self._busy_since = self._busy_since or time.monotonic()
            raise Preempted

    def _busy(self) -> bool:
        return self.busy() or (self.update_slots is not None and not self.update_slots.allowed())

    def run_slice(self) -> SliceResult:
        """Carry the training on until a measure says commit (then commit), the data is used
        up or the server gets work."""
        result = SliceResult(base_version=self.training.base_version, started_at=time.monotonic())
        self._busy_since = None
        steps_before = self.training.steps
        self._post("training")
        try:
            self._follow_drafter()
            result.base_version = self.training.base_version
            if self._ready is None:
                self.refresh_window()
                result.features = self._compute_features()
                if self.training.needs_round:
                    self._follow_policy()
                with self.hand_off():
                    self._ready = self._advance(result)
            if self._ready is not None:
                self._report(result, self._ready)
                result.version = self._commit(result)
        except (Preempted, ServerBusy):
            result.preempted = True
            result.preempt_latency_s = time.monotonic() - (self._busy_since or time.monotonic())
        except NoSamples as err:
            logger.info("spot worker: %s", err)
        finally:
            result.ended_at = time.monotonic()
            result.steps = self.training.steps - steps_before
            result.total_steps = self.training.steps
            self._release_slot()
            self._post("idle")
        return result

    def _post(self, state: str) -> None:
        """This worker's progress in Redis; a failed write never stops training."""
        record = SpotProgress(
            worker_id=self.config.worker_id, state=state, base_version=self.training.base_version,
            steps=self.training.steps_since_base, committed=self.committed,
        )  # fmt: skip
        self._posted_at = time.monotonic()
        try:
            self.progress.write(record)
        except RedisError as err:
            logger.warning("spot worker: progress not written (%s)", err)

    def _follow_drafter(self) -> None:
        """Train from the newest published version: the first one, or one another worker (or a
        warm-up) committed; the uncommitted change carries over."""
        latest = self.channel.latest_version()
        if latest is None:
            raise NoSamples("the job's drafter has no version yet")
        if latest != self.training.base_version:
            logger.info("spot worker: drafter v%d is the newest; rebasing onto it from v%d", latest, self.training.base_version)
            self.training.rebase(latest, self.channel.load(latest)[1])
            self._ready = None

    def _commit(self, result: SliceResult) -> int | None:
        """Commit the candidate as the version after its base, under a lease held for the commit
        only; None when another worker committed first (a later slice rebases). A lease held by
        another worker raises `grpc.RpcError`; the candidate stays ready for a later slice."""
        grant = self.stub.Lease(pb.LeaseRequest(job_id=self.config.job_id, worker_id=self.config.worker_id), metadata=self.metadata)
        ref = pb.LeaseRef(lease_id=grant.lease_id, job_id=grant.job_id)
        if grant.base_version != self.training.base_version:
            self.stub.Release(ref, metadata=self.metadata)
            return None
        try:
            version = commit(self.stub, grant.lease_id, grant.job_id, save_blob(self.training.state()), result.accept_length, self.metadata)
        except BaseException:
            try:
                self.stub.Release(ref, metadata=self.metadata)
            except grpc.RpcError:
                pass
            raise
        logger.info(
            "spot worker: committed v%d (%.3f -> %.3f, +-%.3f, %d sequences)",
            version, result.accept_length_before, result.accept_length, result.gain_standard_error, result.sequences,
        )  # fmt: skip
        self.training.committed(version)
        self._ready = None
        self.committed += 1
        return version

    def _advance(self, result: SliceResult) -> Verdict | None:
        """Train and measure until a measure says commit or the data is used up."""
        while True:
            if self.training.needs_round and not self.training.start_round(self.parts):
                raise NoSamples(f"fewer than {self.training.config.min_held_out} held-out samples with features")
            verdict = self.training.advance(self._check)
            if verdict is None:
                return None
            self._report(result, verdict)
            result.measures += 1
            if verdict.commit:
                return verdict
            comparison = verdict.comparison
            logger.info(
                "spot worker: candidate %.3f vs base %.3f (+-%.3f, %d sequences): not yet",
                comparison.candidate, comparison.base, comparison.standard_error, comparison.sequences,
            )  # fmt: skip

    @staticmethod
    def _report(result: SliceResult, verdict: Verdict) -> None:
        comparison = verdict.comparison
        result.accept_length_before, result.accept_length = comparison.base, comparison.candidate
        result.gain_standard_error = comparison.standard_error
        result.sequences = comparison.sequences

    def refresh_window(self) -> list[Sample]:
        """This worker's share of the job's newest samples, and all of its held-out ones, become
        the training window; returns it. The share is by sample id among the workers on the
        progress board (this one included), so a worker that joins, stops or stays silent past the
        board's TTL moves only its own share. The held-out samples are not split: with a share of
        them each, n workers would each test a commit on 1/n of the held-out sequences."""
        entries = self.samples.latest_entries(self.config.samples)
        window = [Sample(i, seq) for i, record in entries if (seq := training_sequence(record)) is not None]
        if self.config.split_samples:
            workers = {p.worker_id for p in self.progress.read()} | {self.config.worker_id}
            self.training.add_samples(window, lambda sample_id: sample_owner(sample_id, workers) == self.config.worker_id)
        else:
            self.training.add_samples(window)
        if entries:
            self._last_seen = entries[-1][0]
        if not self.training.has_work:
            raise NoSamples(f"nothing to train on: {len(window)} usable samples, all used")
        return self.training.window

    def _compute_features(self) -> int:
        """Features of the window's new samples, a few per request, preemptible between two
        requests; outside the memory hand-off, because the server computes them."""
        missing = self.training.missing_features()
        for group in self._feature_groups(missing):
            self._check()
            try:
                computed = self.features([s.sequence.token_ids for s in group])
            except FeaturesUnavailable as err:  # seen when SGLang split a batched prefill: one at a time
                logger.warning("spot worker: features of %d samples in one request failed (%s); one by one", len(group), err)
                computed = [self._features_alone(sample) for sample in group]
            for sample, features in zip(group, computed, strict=True):
                if features is not None:
                    self.training.features.put(sample.sample_id, features.cpu())
        return len(missing)

    def _feature_groups(self, samples: list[Sample]) -> Iterator[list[Sample]]:
        group: list[Sample] = []
        tokens = 0
        for sample in samples:
            size = len(sample.sequence.token_ids)
            if group and (len(group) == self.config.features_per_request or tokens + size > self.config.features_tokens):
                yield group
                group, tokens = [], 0
            group.append(sample)
            tokens += size
        if group:
            yield group

    def _features_alone(self, sample: Sample) -> torch.Tensor | None:
        self._check()
        try:
            return self.features([sample.sequence.token_ids])[0]
        except FeaturesUnavailable as err:
            logger.warning("spot worker: no features for sample %s (%s); left out", sample.sample_id, err)
            self.training.discard(sample.sample_id)
            return None

    def run_forever(self, poll_s: float = 0.2, on_slice: Callable[[SliceResult], None] | None = None) -> None:
        """Run slices whenever the server has been idle for the grace period and there is work:
        training left on the window, or enough new samples, until `stop()`."""
        # Lowest CPU priority for this thread: what the worker computes while the server is already
        # busy again (until its next check) should delay the rollouts as little as possible.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        idle_since: float | None = None
        self._post("idle")  # on the board before the first slice: the other workers leave it a share
        while not self._stop.wait(poll_s):
            try:
                if time.monotonic() - self._posted_at > HEARTBEAT_S:
                    self._post("idle")
                if self._busy():
                    idle_since = None
                    continue
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since < self.config.idle_grace_s:
                    continue
                if self._ready is None and not self.training.has_work and self.samples.count_after(self._last_seen, self.config.min_new_samples) < self.config.min_new_samples:
                    self._release_slot()  # nothing to do: a worker with work may have it
                    continue
                result = self.run_slice()
                if on_slice is not None:
                    on_slice(result)
            except grpc.RpcError as err:  # leased elsewhere, service restarting: commit later
                logger.info("spot worker: no commit now (%s)", err.details())
            except requests.RequestException as err:
                logger.warning("spot worker: rollout server unreachable (%s)", err)
            except RedisError as err:  # Redis away for longer than the client's retries: try later
                logger.warning("spot worker: Redis unavailable (%s); retrying", err)
                self._stop.wait(OUTAGE_BACKOFF_S)
            except BadBlob as err:  # a drafter version that does not verify (expired, corrupt): try later
                logger.warning("spot worker: drafter version unreadable (%s); retrying", err)
                self._stop.wait(OUTAGE_BACKOFF_S)
            idle_since = None
        try:
            self.progress.remove(self.config.worker_id)
        except RedisError as err:  # its record expires instead
            logger.warning("spot worker: progress not removed (%s)", err)

    def _release_slot(self) -> None:
        if self.update_slots is not None:
            try:
                self.update_slots.release()
            except RedisError as err:  # the slot expires instead
                logger.warning("spot worker: update slot not released (%s)", err)

    def stop(self) -> None:
        self._stop.set()


def lower_priority(nice: int) -> None:
    """Raise the nice value of every thread of this process to `nice` (Linux nice is per thread;
    threads started later inherit it from the one that starts them)."""
    if nice <= 0:
        return
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))


def main(argv: list[str] | None = None) -> None:
    """`python -m rollout_server.spot_worker`: slices on the server's idle time until SIGTERM."""
    import signal
    import sys

    from pydantic import ValidationError
    from pydantic_settings import CliApp

    from tlt.rpc.service import client_channel
    from tlt.settings.spot_worker import SpotWorkerSettings
    from tlt.store.connection import RedisSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = CliApp.run(SpotWorkerSettings, cli_args=sys.argv[1:] if argv is None else argv)
    except ValidationError as err:
        sys.exit(f"spot_worker: invalid settings:\n{err}")
    lower_priority(settings.nice)
    torch.set_num_threads(settings.threads)
    client = RedisSettings().client()
    metadata = (("authorization", f"Bearer {settings.auth_token.get_secret_value()}"),) if settings.auth_token else ()
    config = SpotWorkerConfig(
        job_id=settings.job_id,
        worker_id=settings.worker_id,
        policy_path=str(settings.policy_path),
        samples=settings.samples,
        idle_grace_s=settings.idle_grace_s,
        min_new_samples=settings.min_new_samples,
        split_samples=settings.split_samples,
        continual=ContinualConfig(commit_z=settings.commit_z),
        training=spot_training(settings.epochs, settings.lr),
    )
    marker = HandOffMarker(client, settings.job_id, settings.worker_id)
    wait_for_server(settings.server_url)
    recover_hand_off(settings.server_url, marker)
    hand_off: Callable[[], AbstractContextManager] = nullcontext
    if settings.release_memory == "on" or (settings.release_memory == "auto" and memory_saver_enabled(settings.server_url)):
        hand_off = functools.partial(MemoryHandOff, settings.server_url, marker=marker)
    slots = None if settings.update_slots is None else UpdateSlots(client, settings.job_id, settings.update_slots)

    def busy() -> bool:
        return server_load(settings.server_url) > 0

    with client_channel(settings.drafter_service, settings.tls_ca_file) as channel:
        worker = SpotWorker(
            config,
            WeightChannel(client, settings.job_id, "drafter"),
            SamplesStream(client, settings.job_id),
            drafter_pb2_grpc.DrafterServiceStub(channel),
            busy,
            metadata,
            features=ServerFeatures(settings.server_url).many if settings.features == "server" else None,
            hand_off=hand_off,
            policy_source=lambda: served_model_path(settings.server_url),
            device=settings.resolved_device(),
            dtype=getattr(torch, settings.resolved_dtype()),
            update_slots=slots,
        )
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())

        def report(result: SliceResult) -> None:
            logger.info("slice: %s", result)

        worker.run_forever(poll_s=settings.poll_s, on_slice=report)


if __name__ == "__main__":
    main()
