"""The speculation bandit against a simulated engine whose speed depends on batch size,
draft length and drafter quality: it explores every arm, converges, keeps speculation off at
large batches and on in the tail, and follows a drafter that improves."""

from __future__ import annotations

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


def test_above_the_speculative_batch_cap_only_plain_decoding_runs() -> None:
    bandit = SpeculationBandit(BanditConfig(max_speculative_batch=32))
    for arm in bandit.config.arms:  # the longest chain pays best, at both sizes
        for batch in (32, 33):
            bandit.update(batch, arm, tokens=10 * (arm.draft_steps + 1), seconds=1.0)
    assert bandit.choose(32).draft_steps == 4
    assert bandit.choose(33).draft_steps == 0
    assert SpeculationBandit(BanditConfig(arms=[SpecArm(draft_steps=2)], max_speculative_batch=1)).choose(50).draft_steps == 2
