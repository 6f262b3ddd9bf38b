"""A bandit per batch-size bucket that picks the speculation strategy (an "arm") from measured
throughput, so that speculation runs where it pays (the small-batch long tail) and not where it
costs (large batches, where verification work crowds out useful decoding).

Each bucket runs discounted UCB1: arm means and counts decay by `discount` at every update of
their bucket, so the choice follows a drafter that improves (or a policy that drifts) during
training. Rewards are committed tokens per second per running request (batch throughput grows
with the batch, so an arm pulled while the batch shrank within a bucket was scored on another
scale than its rivals; per request the scale varies much less), divided by the bucket's best mean so far to keep UCB's exploration bonus on a fixed scale. The
buckets end at `max_speculative_batch`: above it only plain decoding runs and nothing is learned.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator


class SpecArm(BaseModel, frozen=True):
    """A speculation strategy the engine can switch to between decode steps (0 steps = off): a
    draft length and where the drafts come from (the EAGLE drafter, or the token history of the
    request's prompt group, which costs no forward pass)."""

    draft_steps: int = Field(ge=0, le=16)
    topk: int = Field(1, ge=1, le=8)
    source: Literal["eagle", "history"] = "eagle"

    @model_validator(mode="after")
    def _history_drafts_something(self) -> SpecArm:
        if self.source == "history" and (self.draft_steps == 0 or self.topk != 1):
            raise ValueError("a history arm drafts a chain: draft_steps >= 1 and topk 1")
        return self

    @property
    def speculative(self) -> bool:
        return self.draft_steps > 0

    @property
    def label(self) -> str:
        """A short name for metrics and reports: `off`, `eagle4`, `history8`."""
        return f"{self.source}{self.draft_steps}" if self.speculative else "off"


class BanditConfig(BaseModel):
    """Buckets, arms and learning rate of the controller; the defaults are the shipped ones."""

    bucket_bounds: list[int] = Field(
        default_factory=lambda: [2, 4, 8, 16, 32, 48],
        description="upper bounds (exclusive) of the batch-size buckets; the last bucket ends at "
        "max_speculative_batch",
    )
    arms: list[SpecArm] = Field(default_factory=lambda: [SpecArm(draft_steps=s) for s in (0, 1, 2, 3, 4)])
    max_speculative_batch: int = Field(
        64,
        ge=1,
        description="speculative arms run (and get CUDA graphs) only up to this running batch size; above it "
        "every step is plain decoding. Each speculative arm captures draft, draft-extend and verify graphs at "
        "each batch size it may see: without a cap, start-up takes minutes (or runs out of memory on a big model)",
    )
    catch_up_tokens: int = Field(
        256,
        ge=0,
        le=65536,
        description="at 0 draft steps the drafter does not run; it catches up on up to this many of each request's "
        "latest positions when drafting resumes (older ones stay stale: lossless, lower acceptance). 0: the drafter "
        "runs at every step instead, as SGLang's adaptive worker does",
    )
    exploration: float = Field(0.1, ge=0, description="UCB exploration weight")
    discount: float = Field(0.995, gt=0, le=1, description="per-update decay of a bucket's statistics")

    @field_validator("bucket_bounds")
    @classmethod
    def _increasing(cls, bounds: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(bounds)) or (bounds and bounds[0] < 1):
            raise ValueError("bucket bounds must be positive and strictly increasing")
        return bounds

    @model_validator(mode="after")
    def _buckets_end_at_the_cap(self) -> BanditConfig:
        cap = self.max_speculative_batch
        if "bucket_bounds" not in self.model_fields_set:  # the default bounds follow a smaller cap
            self.bucket_bounds = [bound for bound in self.bucket_bounds if bound < cap]
        if self.bucket_bounds and self.bucket_bounds[-1] > cap:
            raise ValueError(
                f"bucket bound {self.bucket_bounds[-1]} lies above max_speculative_batch "
                f"{self.max_speculative_batch}: no arm but plain decoding runs there"
            )
        return self

    @field_validator("arms")
    @classmethod
    def _distinct(cls, arms: list[SpecArm]) -> list[SpecArm]:
        if not arms or len(set(arms)) != len(arms):
            raise ValueError("arms must be a non-empty list of distinct strategies")
        return arms


@dataclass
class _Bucket:
    counts: list[float]
    sums: list[float]
    best_mean: float = 0.0
    history: list[int] = field(default_factory=list)

    def mean(self, arm: int) -> float:
        return self.sums[arm] / self.counts[arm] if self.counts[arm] > 0 else 0.0


class SpeculationBandit:
    """Chooses an arm for the current running-batch size and learns from the measured rate."""

    def __init__(self, config: BanditConfig | None = None) -> None:
        self.config = config or BanditConfig()
        n_arms = len(self.config.arms)
        self._buckets = [_Bucket([0.0] * n_arms, [0.0] * n_arms) for _ in range(len(self.config.bucket_bounds) + 1)]

    def bucket_of(self, batch_size: int) -> int:
        """Index of the bucket holding `batch_size` (>= 1)."""
        if batch_size < 1:
            raise ValueError("batch size must be at least 1")
        return bisect.bisect_right(self.config.bucket_bounds, batch_size)

    def choose(self, batch_size: int) -> SpecArm:
        """The arm to run next at this batch size: plain decoding above `max_speculative_batch`,
        else each arm once, then the best UCB score."""
        if self._plain_only(batch_size):
            return self.off_arm
        bucket = self._buckets[self.bucket_of(batch_size)]
        untried = [i for i, c in enumerate(bucket.counts) if c == 0]
        if untried:
            arm = untried[0]
        else:
            total = sum(bucket.counts)
            scale = bucket.best_mean or 1.0

            def score(i: int) -> float:
                bonus = self.config.exploration * math.sqrt(2 * math.log(total) / bucket.counts[i])
                return bucket.mean(i) / scale + bonus

            arm = max(range(len(bucket.counts)), key=score)
        return self.config.arms[arm]

    @property
    def off_arm(self) -> SpecArm | None:
        """The arm without speculation, if the configuration has one."""
        return next((arm for arm in self.config.arms if not arm.speculative), None)

    def _plain_only(self, batch_size: int) -> bool:
        """Whether only plain decoding runs at this batch size (above the speculative cap)."""
        return batch_size > self.config.max_speculative_batch and self.off_arm is not None

    def update(self, batch_size: int, arm: SpecArm, tokens: int, seconds: float) -> None:
        """Record that `arm` committed `tokens` tokens in `seconds` over a running batch of this size
        (nothing is learned above `max_speculative_batch`, where `choose` runs plain decoding only)."""
        if seconds <= 0 or tokens < 0:
            raise ValueError("need tokens >= 0 and seconds > 0")
        if self._plain_only(batch_size):
            return
        bucket = self._buckets[self.bucket_of(batch_size)]
        index = self.config.arms.index(arm)
        gamma = self.config.discount
        bucket.counts = [c * gamma for c in bucket.counts]
        bucket.sums = [s * gamma for s in bucket.sums]
        bucket.counts[index] += 1.0
        bucket.sums[index] += tokens / seconds / batch_size
        bucket.best_mean = max(bucket.mean(i) for i in range(len(bucket.counts)))
        bucket.history.append(index)

    def preferred(self, batch_size: int) -> SpecArm:
        """The arm with the best estimated rate at this batch size (no exploration)."""
        bucket = self._buckets[self.bucket_of(batch_size)]
        return self.config.arms[max(range(len(bucket.counts)), key=bucket.mean)]

    def pulls(self, batch_size: int) -> list[int]:
        """Arm indices chosen in this batch size's bucket, in order (for metrics and tests)."""
        return list(self._buckets[self.bucket_of(batch_size)].history)
