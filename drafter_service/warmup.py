"""Offline warm-up of a job's drafter in the service: sequences from a JSONL dataset (under the
service's data directory) or from the job's samples stream, the policy's features computed with
transformers, one training round (`tlt.drafter.slice`) under the job's lease, and a commit when
the held-out accept length beats the base version's. Progress is reported as events."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ValidationError, model_validator
from safetensors.torch import save as save_blob
from transformers import AutoModelForCausalLM, AutoTokenizer

from drafter_service.store import DrafterStore
from tlt.drafter.model import PolicyParts
from tlt.drafter.slice import split_held_out, train_round, usable_sequences
from tlt.drafter.training import DrafterTrainingConfig, PolicySequence, policy_features
from tlt.rpc import drafter_api as api
from tlt.rpc.errors import Cancelled, FailedPrecondition
from tlt.store.samples_stream import MAX_SAMPLE_TOKENS, SampleRecord, SamplesStream

WARMUP_WORKER = "warmup"
DEFAULT_EPOCHS, DEFAULT_SAMPLES, DEFAULT_EVAL_FRACTION = 20, 2048, 0.1
DRAFT_STEPS, EVAL_EVERY = 4, 4  # the accept-length measure, as the spot worker's
_EVENTS_PER_PHASE = 50  # progress events per phase, whatever its length


@dataclass
class WarmupEvent:
    phase: str
    step: int = 0
    total: int = 0
    loss: float = 0.0
    accept_length_before: float = 0.0
    accept_length: float = 0.0
    version: int = 0


class TextLine(BaseModel):
    prompt: str
    response: str

    @model_validator(mode="after")
    def _not_empty(self) -> TextLine:
        if not self.prompt:
            raise ValueError("prompt is empty")
        return self


def dataset_file(data_dir: Path | None, dataset_path: str) -> Path:
    """The dataset's path, which must lie under the data directory (no reading elsewhere)."""
    if data_dir is None:
        raise FailedPrecondition("dataset_path: this service has no --data-dir; warm up from the samples stream instead")
    root = data_dir.resolve()
    path = (root / dataset_path).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"dataset_path: {dataset_path!r} is outside the service's data directory")
    if not path.is_file():
        raise ValueError(f"dataset_path: no file {dataset_path!r} in the service's data directory")
    return path


def read_dataset(path: Path, policy_path: str, vocab_size: int, limit: int) -> list[PolicySequence]:
    """Up to `limit` sequences of a JSONL file of token ids or of prompt/response text; a bad line
    is an error naming its number."""
    tokenizer = None
    sequences: list[PolicySequence] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if len(sequences) >= limit:
                break
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if isinstance(raw, dict) and "prompt_ids" in raw:
                    record = SampleRecord.model_validate(raw)
                    prompt, output = record.prompt_ids, record.output_ids
                else:
                    text = TextLine.model_validate(raw)
                    tokenizer = tokenizer or AutoTokenizer.from_pretrained(policy_path)
                    prompt = tokenizer(text.prompt).input_ids
                    output = tokenizer(text.response, add_special_tokens=False).input_ids
            except (json.JSONDecodeError, ValidationError) as err:
                raise ValueError(f"dataset_path: line {number}: {err}") from err
            ids = prompt + output
            if len(ids) > MAX_SAMPLE_TOKENS or any(i >= vocab_size for i in ids):
                raise ValueError(f"dataset_path: line {number}: too long or token ids outside the vocabulary [0, {vocab_size})")
            if len(output) > 1:
                sequences.append(PolicySequence(ids, len(prompt)))
    return sequences


class Warmup:
    """Runs warm-ups against the store; one per job at a time (it holds the job's lease)."""

    def __init__(self, store: DrafterStore, data_dir: Path | None) -> None:
        self.store, self.data_dir = store, data_dir

    def run(self, request: api.WarmupRequest, active: Callable[[], bool] = lambda: True) -> Iterator[WarmupEvent]:
        """Warm the job's drafter up, yielding progress, the last event with phase "done". The work
        runs in a thread; it stops, giving its lease back, when `active()` turns false or this
        generator is closed."""
        events: queue.Queue[WarmupEvent | Exception] = queue.Queue()
        stop = threading.Event()

        def work() -> None:
            try:
                self._warm_up(request, lambda: active() and not stop.is_set(), events.put)
            except Exception as err:  # noqa: BLE001 (re-raised in the caller's thread)
                events.put(err)

        thread = threading.Thread(target=work, name=f"warmup-{request.job_id}", daemon=True)
        thread.start()
        try:
            while True:
                event = events.get()
                if isinstance(event, Exception):
                    raise event
                yield event
                if event.phase == "done":
                    return
        finally:
            stop.set()
            thread.join()

    def _sequences(self, request: api.WarmupRequest, policy_path: str, vocab_size: int) -> list[PolicySequence]:
        limit = request.max_samples or DEFAULT_SAMPLES
        if request.dataset_path:
            return read_dataset(dataset_file(self.data_dir, request.dataset_path), policy_path, vocab_size, limit)
        return usable_sequences(SamplesStream(self.store.client, request.job_id).latest(limit))

    def _warm_up(self, request: api.WarmupRequest, active: Callable[[], bool], emit: Callable[[WarmupEvent], None]) -> None:
        record = self.store.record(request.job_id)
        policy = AutoModelForCausalLM.from_pretrained(record.policy_path, dtype=torch.float32).eval()
        sequences = self._sequences(request, record.policy_path, policy.config.vocab_size)
        if len(sequences) < 2:
            raise FailedPrecondition(f"{len(sequences)} usable sequences (a response of 2+ tokens each): nothing to warm up on")
        train, held_out = split_held_out(sequences, request.eval_fraction or DEFAULT_EVAL_FRACTION, seed=0)
        sequences = held_out + train  # features are computed in this order
        cut = len(held_out)

        lease = self.store.lease(api.LeaseRequest(job_id=request.job_id, worker_id=WARMUP_WORKER))
        ref = api.LeaseRef(lease_id=lease.lease_id, job_id=request.job_id)
        renewed = time.monotonic()

        def check() -> None:
            nonlocal renewed
            if not active():
                raise Cancelled
            if time.monotonic() - renewed > self.store.lease_ttl_s / 3:
                self.store.heartbeat(ref)
                renewed = time.monotonic()

        def every(total: int) -> int:
            return max(1, total // _EVENTS_PER_PHASE)

        try:
            features = []
            for index, sequence in enumerate(sequences, start=1):
                check()
                features.append(policy_features(policy, sequence.token_ids))
                if index % every(len(sequences)) == 0 or index == len(sequences):
                    emit(WarmupEvent("features", index, len(sequences)))

            def on_step(step: int, total: int, metrics: dict[str, float]) -> None:
                if step % every(total) == 0 or step == total:
                    emit(WarmupEvent("training", step, total, loss=metrics["loss"]))

            result = train_round(
                policy.config,
                PolicyParts(policy),
                self.store.channel(request.job_id).load(lease.base_version)[1],
                (sequences[cut:], features[cut:]),
                (sequences[:cut], features[:cut]),
                DrafterTrainingConfig(epochs=request.epochs or DEFAULT_EPOCHS),
                DRAFT_STEPS,
                EVAL_EVERY,
                check=check,
                on_step=on_step,
            )
            check()
        except BaseException:
            self.store.release(ref)
            raise
        done = WarmupEvent(
            "done", result.steps, result.steps, accept_length_before=result.accept_length_before, accept_length=result.accept_length
        )
        if result.improved:
            weights = save_blob(result.state)
            done.version = self.store.commit(
                api.CommitRequest(lease_id=ref.lease_id, job_id=ref.job_id, weights=weights, accept_length=result.accept_length)
            )
        else:
            self.store.release(ref)
        emit(done)
