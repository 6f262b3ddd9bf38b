"""Drafter training that outlives the idle gaps it runs in.

A spot worker gets idle time in pieces of a second or two, and a request can take any piece
away. `ContinualTraining` keeps what each piece produced: the drafter in training, its AdamW
state, its step count and its place in the data; the policy's features of every sample, computed
once; the base version's held-out score, measured once per round. `check` runs between two units
of work (a training step, one held-out sequence's measure) and may raise to stop; whatever it
interrupts is kept, and the next piece carries on from there.

A round fixes what candidates are compared against: the base version, the policy parts and a
held-out set (the newest held-out samples). Every `eval_steps` training steps the candidate is
measured on that set, paired with the base's cached score, and it is worth committing when it
beats the base at the one-sided level of `commit_z` normal errors (`PairedGain.beats`: Student's t
on the held-out sequences). A round ends with a commit, a rebase (another
worker committed) or `round_evals` evaluations that did not beat the base; the next one takes the
policy parts the server serves then and the newest held-out samples. Which side of the split a
sample is on follows from its id, so no slice ever trains on a sample another held out. Which
worker of a job trains on a sample follows from its id too (`sample_owner`), so the workers of one
job split the feature prefills and the training between them; every worker measures on the same
held-out samples, so the commit test's power does not shrink as the fleet grows.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, Field, model_validator
from transformers import PretrainedConfig

from tlt.drafter.acceptance import chain_accept_lengths, response_starts
from tlt.drafter.comparison import PairedGain, paired_gain
from tlt.drafter.model import EagleDrafter, PolicyParts
from tlt.drafter.training import (
    DrafterTrainingConfig,
    PackedBatch,
    PolicySequence,
    new_optimizer,
    pack,
    training_step,
)


class ContinualConfig(BaseModel):
    """How continual drafter training splits, measures and decides."""

    eval_fraction: float = Field(0.2, gt=0, lt=1, description="share of samples (chosen by id) never trained on")
    held_out: int = Field(64, ge=2, le=4096, description="held-out sequences a round measures on")
    min_held_out: int = Field(
        8, ge=2, le=4096, description="held-out sequences with features a round needs to start (its error comes from them)"
    )
    draft_steps: int = Field(4, ge=1, le=16, description="chain length of the accept-length measure")
    eval_every: int = Field(4, ge=1, description="measure acceptance at every n-th response position")
    eval_steps: int = Field(32, ge=1, description="training steps between two measures of the candidate")
    commit_z: float = Field(
        2.0, ge=0, description="commit when the paired gain over the base passes a one-sided test at this normal z's level"
    )
    round_evals: int = Field(4, ge=1, description="measures without a commit before a new round (fresh held-out set)")
    feature_cache_mb: float = Field(1024, gt=0, description="bound on the cached features (oldest out first)")

    @model_validator(mode="after")
    def _minimum_fits(self) -> ContinualConfig:
        if self.min_held_out > self.held_out:
            raise ValueError(f"min_held_out ({self.min_held_out}) exceeds held_out ({self.held_out})")
        return self


@dataclass
class Sample:
    """A finished rollout by its stream id."""

    sample_id: str
    sequence: PolicySequence


@dataclass
class Verdict:
    """One measure of the candidate against the round's base."""

    comparison: PairedGain
    steps: int  # training steps the candidate has had in all
    commit: bool


def is_held_out(sample_id: str, fraction: float) -> bool:
    """The sample's side of the split, the same in every worker and slice."""
    return zlib.crc32(sample_id.encode()) % 10_000 < fraction * 10_000


def sample_owner(sample_id: str, workers: Collection[str]) -> str:
    """The worker, of `workers`, whose share `sample_id` is: rendezvous hashing, so the shares
    are even and a worker that joins or leaves moves only its own share. A cryptographic hash,
    not CRC-32: CRC is affine, so which of two workers wins would be the same for every sample."""
    if not workers:
        raise ValueError("no worker to own the sample")
    return max(workers, key=lambda worker: hashlib.blake2b(f"{worker}\0{sample_id}".encode(), digest_size=8).digest())


class FeatureCache:
    """The policy's features of samples by id, bounded in bytes (oldest out first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, sample_id: str) -> torch.Tensor:
        return self._entries[sample_id]

    def put(self, sample_id: str, features: torch.Tensor) -> None:
        self._drop(sample_id)
        self._entries[sample_id] = features
        self.bytes += features.nbytes
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            self._drop(next(iter(self._entries)))

    def retain(self, sample_ids: set[str]) -> None:
        """Forget the samples not in `sample_ids` (they left the training window)."""
        for sample_id in [s for s in self._entries if s not in sample_ids]:
            self._drop(sample_id)

    def _drop(self, sample_id: str) -> None:
        gone = self._entries.pop(sample_id, None)
        if gone is not None:
            self.bytes -= gone.nbytes


@dataclass
class _Round:
    parts: PolicyParts
    held_out: list[tuple[str, PolicySequence, torch.Tensor]]
    base: EagleDrafter
    base_scores: dict[str, list[int]] = field(default_factory=dict)
    failed: int = 0


class ContinualTraining:
    """One job's drafter in training, across all the slices of one worker."""

    def __init__(
        self,
        policy_config: PretrainedConfig,
        config: ContinualConfig,
        training: DrafterTrainingConfig,
        device: torch.device,
    ) -> None:
        """`training.epochs`: passes over the same samples before training waits for new ones;
        its LR stays constant (a schedule would restart with every slice)."""
        self.policy_config, self.config, self.training, self.device = policy_config, config, training, device
        self.drafter = EagleDrafter(policy_config).to(device)
        self.optimizer = new_optimizer(self.drafter, training)
        self.base_version = 0
        self._base_steps = 0  # `steps` when the base was set
        self._base_state: dict[str, torch.Tensor] = {}
        self._dtypes: dict[str, torch.dtype] = {}  # a version's tensors keep their dtypes
        self.steps = 0
        self._steps_since_eval = 0
        self._order: list[str] = []
        self._cursor = 0
        self._passes = 0  # over the order, since the last new sample
        self._pool: dict[str, PolicySequence] = {}
        self._discarded: set[str] = set()  # samples whose features cannot be had
        self.features = FeatureCache(int(config.feature_cache_mb * 2**20))
        self._round: _Round | None = None
        self._candidate_scores: dict[str, list[int]] = {}

    def rebase(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Train from `version` (the first one, or one another worker committed). The change made
        since the old base and not committed is added onto it, as a rebased patch, so the work of
        two workers adds up; the weights are set in place, so the optimizer's moments carry over."""
        own = self.drafter.state_dict()
        if set(state) != set(own):
            raise ValueError(f"drafter v{version}'s tensors are not this drafter's: {sorted(set(state) ^ set(own))[:4]}")
        with torch.no_grad():
            for name, tensor in own.items():
                new = state[name].to(tensor.device, tensor.dtype)
                if name in self._base_state:
                    new = new + (tensor - self._base_state[name])
                tensor.copy_(new)
        self._dtypes = {name: t.dtype for name, t in state.items()}
        self._set_base(version)

    def committed(self, version: int) -> None:
        """The candidate is published as `version`: it is the base from now on."""
        self._set_base(version)

    @property
    def steps_since_base(self) -> int:
        """Training steps of the candidate not committed yet."""
        return self.steps - self._base_steps

    def _set_base(self, version: int) -> None:
        self.base_version, self._base_steps = version, self.steps
        self._base_state = {name: t.detach().clone() for name, t in self.drafter.state_dict().items()}
        self._round = None
        self._candidate_scores = {}
        self._steps_since_eval = 0

    def state(self) -> dict[str, torch.Tensor]:
        """The candidate's tensors, on the CPU in the base version's dtypes (to commit)."""
        return {name: t.detach().to("cpu", self._dtypes.get(name, t.dtype)).contiguous() for name, t in self.drafter.state_dict().items()}

    def add_samples(self, window: Sequence[Sample], trains_on: Callable[[str], bool] = lambda sample_id: True) -> int:
        """The newest samples of the job, oldest first: the training window from now on. Returns
        how many are new (new ones reset the count of passes). Of the training samples only those
        whose id `trains_on` accepts are kept (a worker's share); of the held-out samples only the
        newest `held_out`, all of them whatever the share: a round measures on no others, so no
        other's features are computed."""
        self._discarded &= {s.sample_id for s in window}  # forget those that left the window
        held = [s.sample_id for s in window if is_held_out(s.sample_id, self.config.eval_fraction)]
        held_out, kept = set(held), set(held[-self.config.held_out :])
        window = [
            s
            for s in window
            if s.sample_id not in self._discarded and (s.sample_id in kept if s.sample_id in held_out else trains_on(s.sample_id))
        ]
        new = sum(1 for s in window if s.sample_id not in self._pool)
        self._pool = {s.sample_id: s.sequence for s in window}
        self.features.retain(set(self._pool))
        if new:  # a fresh pass over the new window
            self._passes, self._order, self._cursor = 0, [], 0
        return new

    @property
    def window(self) -> list[Sample]:
        """The samples `add_samples` kept, oldest first."""
        return [Sample(i, seq) for i, seq in self._pool.items()]

    def discard(self, sample_id: str) -> None:
        """Leave a sample out for good (its features cannot be computed)."""
        self._discarded.add(sample_id)
        self._pool.pop(sample_id, None)

    def missing_features(self) -> list[Sample]:
        """Samples of the window whose features are not cached yet, newest first."""
        return [Sample(i, seq) for i, seq in reversed(self._pool.items()) if i not in self.features]

    @property
    def needs_round(self) -> bool:
        """True when the next `advance` needs `start_round` first."""
        return self._round is None

    def start_round(self, parts: PolicyParts) -> bool:
        """Begin a round with these policy parts and the newest held-out samples with features;
        False when the window holds fewer than `min_held_out`."""
        # The pool keeps only the newest `held_out` held-out samples (`add_samples`).
        held = [(i, seq) for i, seq in self._pool.items() if is_held_out(i, self.config.eval_fraction) and i in self.features]
        if len(held) < self.config.min_held_out:
            return False
        base = EagleDrafter(self.policy_config).to(self.device)
        base.load_state_dict(self._base_state)
        base.eval()
        self._round = _Round(parts, [(i, seq, self.features.get(i).to(self.device)) for i, seq in held], base)
        self._candidate_scores = {}
        return True

    @property
    def has_work(self) -> bool:
        """Features to compute, training data left to pass over, or a measure due."""
        if self._steps_since_eval or any(i not in self.features for i in self._pool):
            return True
        return self._passes < self.training.epochs and any(self._trainable())

    def advance(self, check: Callable[[], None] = lambda: None) -> Verdict | None:
        """Train and measure until a verdict, or None when the data is used up (`training.epochs`
        passes without a new sample). Needs a round (`start_round`)."""
        if self._round is None:
            raise RuntimeError("advance needs a round: call start_round first")
        self._score(self._round.base, self._round.base_scores, check)
        while not self._eval_due():
            step = self._next_step()
            if step is None:
                if self._steps_since_eval == 0:
                    return None
                break  # the last steps still get their measure
            rows, consumed = step
            check()
            self.drafter.train()
            training_step(self.drafter, self._round.parts, rows, self.optimizer, self.training)
            self.drafter.eval()
            self.steps += 1
            self._steps_since_eval += 1
            self._cursor += consumed
        self._score(self.drafter, self._candidate_scores, check)
        comparison = paired_gain(self._round.base_scores, self._candidate_scores)
        verdict = Verdict(comparison, self.steps, comparison.beats(self.config.commit_z))
        self._steps_since_eval = 0
        self._candidate_scores = {}
        if not verdict.commit:
            self._round.failed += 1
            if self._round.failed >= self.config.round_evals:
                self._round = None
        return verdict

    def _eval_due(self) -> bool:
        if self._steps_since_eval == 0:
            return False
        return self._steps_since_eval >= self.config.eval_steps or self._passes >= self.training.epochs or not any(self._trainable())

    def _trainable(self) -> Iterator[str]:
        return (i for i in self._pool if i in self.features and not is_held_out(i, self.config.eval_fraction))

    def _score(self, drafter: EagleDrafter, scores: dict[str, list[int]], check: Callable[[], None]) -> None:
        """Accept lengths of the round's held-out sequences not scored yet, one per unit of work."""
        assert self._round is not None
        for sample_id, sequence, features in self._round.held_out:
            if sample_id in scores:
                continue
            check()
            starts = response_starts(sequence, self.config.draft_steps, self.config.eval_every)
            scores[sample_id] = chain_accept_lengths(drafter, self._round.parts, sequence, features, self.config.draft_steps, starts)

    def _next_step(self) -> tuple[list[PackedBatch], int] | None:
        """The packed rows of the next training step, from the cursor on (a new shuffled pass when
        the order is used up), and how many entries of the order they use; None when
        `training.epochs` passes went by without a new sample."""
        rows: list[PackedBatch] = []
        consumed = 0
        budget = self.training.tokens_per_row
        while len(rows) < self.training.rows_per_step:
            if self._cursor + consumed >= len(self._order):
                if rows:
                    break
                if self._order:
                    self._passes += 1
                if self._passes >= self.training.epochs:
                    return None
                self._order = list(self._trainable())
                random.Random(self.training.seed + self.steps).shuffle(self._order)
                self._cursor, consumed = 0, 0
                if not self._order:
                    return None
            row_ids: list[str] = []
            used = 0
            while self._cursor + consumed < len(self._order):
                sample_id = self._order[self._cursor + consumed]
                if sample_id in self._pool and sample_id in self.features:  # else: left the window
                    steps = min(len(self._pool[sample_id].token_ids) - 1, budget)
                    if row_ids and used + steps > budget:
                        break
                    row_ids.append(sample_id)
                    used += steps
                consumed += 1
            if row_ids:
                rows += pack([self._pool[i] for i in row_ids], [self.features.get(i) for i in row_ids], budget)
        return rows, consumed
