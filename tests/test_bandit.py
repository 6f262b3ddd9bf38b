"""The speculation bandit against simulated engines whose speed depends on batch size, draft
length and drafter quality (one of them replays the step costs measured on our CPU engine): it
explores every arm, converges, keeps speculation off at large batches and on in the tail, picks
the measured best arm per bucket while the batch shrinks, and follows a drafter that improves."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from tlt.speculation.bandit import BanditConfig, SpecArm, SpeculationBandit


class SimulatedEngine:
    """One decode step: a fixed overhead, verify work for batch x (steps + 1) tokens, and a draft
    pass per step. A chain of s drafts with per-token acceptance a yields (1 - a^(s+1)) / (1 - a)
    tokens per sequence. Small batches are overhead-bound (speculation pays); large ones are
    compute-bound (it costs)."""

    def __init__(self, acceptance: float, seed: int = 0) -> None:
        self.acceptance = acceptance
        self.rng = random.Random(seed)

    def step(self, batch: int, arm: SpecArm) -> tuple[int, float]:
        s, a = arm.draft_steps, self.acceptance
        per_sequence = (1 - a ** (s + 1)) / (1 - a)
        seconds = 0.010 + 0.001 * batch * (s + 1) + 0.002 * s
        seconds *= self.rng.uniform(0.9, 1.1)
        return round(batch * per_sequence), seconds


# Seconds per decode step of the adaptive worker pinned to each arm, and tokens it commits per
# request per step, at running batch 1, 4, 16 and 64: `python -m benchmarks.spec_step_cost` on the
# 2-core development machine (bundled model and drafter, greedy). Arm 0 costs 1.6x a plain step.
MEASURED_BATCHES = (1, 4, 16, 64)
MEASURED_STEP_S = {
    0: (0.00975, 0.01155, 0.01267, 0.01799),
    1: (0.0108, 0.01264, 0.01695, 0.02564),
    2: (0.01441, 0.01627, 0.0278, 0.04532),
    3: (0.02035, 0.02289, 0.03642, 0.06678),
    4: (0.01683, 0.01914, 0.02846, 0.07262),
}
MEASURED_TOKENS = {0: 1.0, 1: 1.81, 2: 2.56, 3: 3.21, 4: 4.05}


class MeasuredEngine:
    """Replays the measured table: step time interpolated linearly in log(batch), +-5% noise per
    step; committed tokens per request drawn around the measured mean."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    @staticmethod
    def mean_step_s(batch: int, steps: int) -> float:
        x = [math.log(b) for b in MEASURED_BATCHES]
        t = math.log(min(max(batch, MEASURED_BATCHES[0]), MEASURED_BATCHES[-1]))
        i = min(sum(1 for v in x if v <= t), len(x) - 1)
        lo, hi = MEASURED_STEP_S[steps][i - 1], MEASURED_STEP_S[steps][i]
        return lo + (hi - lo) * (t - x[i - 1]) / (x[i] - x[i - 1])

    def per_request_rate(self, batch: int, arm: SpecArm) -> float:
        return MEASURED_TOKENS[arm.draft_steps] / self.mean_step_s(batch, arm.draft_steps)

    def step(self, batch: int, arm: SpecArm) -> tuple[int, float]:
        tokens = round(batch * MEASURED_TOKENS[arm.draft_steps] * self.rng.uniform(0.9, 1.1))
        return tokens, self.mean_step_s(batch, arm.draft_steps) * self.rng.uniform(0.95, 1.05)


def _run(bandit: SpeculationBandit, engine: SimulatedEngine, batch: int, steps: int) -> None:
    for _ in range(steps):
        arm = bandit.choose(batch)
        tokens, seconds = engine.step(batch, arm)
        bandit.update(batch, arm, tokens, seconds)


def _true_rates(engine: SimulatedEngine, batch: int, arms: list[SpecArm]) -> dict[SpecArm, float]:
    quiet = SimulatedEngine(engine.acceptance, seed=1)
    rate = {}
    for arm in arms:
        samples = [quiet.step(batch, arm) for _ in range(400)]
        rate[arm] = sum(t for t, _ in samples) / sum(s for _, s in samples)
    return rate


def test_default_arms_give_the_bandit_a_real_choice() -> None:
    arms = BanditConfig().arms
    assert any(not a.speculative for a in arms) and sum(a.speculative for a in arms) >= 2


@pytest.mark.parametrize("batch", [1, 4, 64])
def test_explores_every_arm_then_converges_to_the_best(batch: int) -> None:
    near_best_share = []
    for seed in range(5):
        bandit, engine = SpeculationBandit(), SimulatedEngine(acceptance=0.8, seed=seed)
        _run(bandit, engine, batch, 400)
        pulls = bandit.pulls(batch)
        assert set(pulls[: len(bandit.config.arms)]) == set(range(len(bandit.config.arms)))
        rates = _true_rates(engine, batch, bandit.config.arms)
        best = max(rates.values())
        good = {i for i, arm in enumerate(bandit.config.arms) if rates[arm] >= 0.95 * best}
        assert len(good) < len(bandit.config.arms)  # the workload does separate the arms
        assert rates[bandit.preferred(batch)] >= 0.95 * best
        near_best_share.append(sum(i in good for i in pulls[-100:]) / 100)
    # Converged: after 300 steps, mostly near-best arms (the rest is exploration that keeps the
    # bandit able to follow a changing drafter).
    assert sum(near_best_share) / len(near_best_share) >= 0.8, near_best_share


def test_speculation_on_in_the_tail_and_off_at_large_batches() -> None:
    bandit, engine = SpeculationBandit(), SimulatedEngine(acceptance=0.8)
    for batch in (1, 2, 64, 128):
        _run(bandit, engine, batch, 300)
    assert bandit.preferred(1).draft_steps >= 2
    assert bandit.preferred(2).draft_steps >= 2
    assert not bandit.preferred(64).speculative
    assert not bandit.preferred(128).speculative


def test_follows_a_drafter_that_improves() -> None:
    bandit, engine = SpeculationBandit(), SimulatedEngine(acceptance=0.05)
    _run(bandit, engine, 8, 300)
    assert not bandit.preferred(8).speculative  # a useless drafter is not worth its cost
    engine.acceptance = 0.9  # a retrained drafter is hot-swapped in
    _run(bandit, engine, 8, 400)
    assert bandit.preferred(8).speculative


def test_buckets_and_validation() -> None:
    bandit = SpeculationBandit(BanditConfig(bucket_bounds=[2, 8]))
    assert [bandit.bucket_of(b) for b in (1, 2, 7, 8, 1000)] == [0, 1, 1, 2, 2]
    with pytest.raises(ValueError):
        bandit.bucket_of(0)
    with pytest.raises(ValueError):
        bandit.update(1, bandit.config.arms[0], 3, 0.0)
    with pytest.raises(ValidationError):
        BanditConfig(bucket_bounds=[4, 4])
    with pytest.raises(ValidationError):
        BanditConfig(arms=[SpecArm(draft_steps=1), SpecArm(draft_steps=1)])
    with pytest.raises(ValueError, match="history arm drafts a chain"):
        SpecArm(draft_steps=0, source="history")
    # One length from two sources: two arms.
    assert len(BanditConfig(arms=[SpecArm(draft_steps=2), SpecArm(draft_steps=2, source="history")]).arms) == 2


def test_above_the_speculative_batch_cap_only_plain_decoding_runs() -> None:
    bandit = SpeculationBandit(BanditConfig(max_speculative_batch=32))
    for arm in bandit.config.arms:  # the longest chain pays best, at both sizes
        for batch in (32, 33):
            bandit.update(batch, arm, tokens=10 * (arm.draft_steps + 1), seconds=1.0)
    assert bandit.choose(32).draft_steps == 4
    assert bandit.choose(33).draft_steps == 0
    assert SpeculationBandit(BanditConfig(arms=[SpecArm(draft_steps=2)], max_speculative_batch=1)).choose(50).draft_steps == 2


@pytest.mark.parametrize("seed", range(3))
def test_picks_the_measured_best_arm_in_every_bucket_of_a_shrinking_batch(seed: int) -> None:
    """A rollout batch of 64 drains to its last request; in each bucket the bandit's preferred arm
    is the one with the best committed tokens per second per request, averaged over the batch
    sizes the bucket saw (its nearest rival where two are within 5%)."""
    bandit, engine = SpeculationBandit(), MeasuredEngine(seed)
    arms = bandit.config.arms
    for batch in range(bandit.config.max_speculative_batch, 0, -1):
        _run(bandit, engine, batch, 60)
    buckets: dict[int, list[int]] = {}
    for batch in range(1, bandit.config.max_speculative_batch + 1):
        buckets.setdefault(bandit.bucket_of(batch), []).append(batch)
    chosen, best = [], []
    for sizes in buckets.values():
        rate = {arm: sum(engine.per_request_rate(b, arm) for b in sizes) / len(sizes) for arm in arms}
        top = max(rate.values())
        preferred = bandit.preferred(sizes[0])
        chosen.append(preferred.draft_steps)
        best.append(max(rate, key=rate.get).draft_steps)
        assert rate[preferred] >= 0.95 * top, (sizes, preferred, rate)
    # The table separates the arms: 4 draft steps in the tail, a shorter chain near the cap.
    assert best[0] == 4 and best[-1] != 4
    assert chosen[:4] == best[:4]
