"""The learning-parity test of the RL-step benchmark on curves with a known answer."""

from __future__ import annotations

import random

import pytest

from benchmarks.parity import reward_parity


def _curve(seed: int, shift: float = 0.0, steps: int = 30) -> list[float]:
    rng = random.Random(seed)
    return [0.5 + 0.004 * step + shift + rng.gauss(0, 0.02) for step in range(steps)]


def test_two_runs_of_one_distribution_are_equivalent() -> None:
    parity = reward_parity(_curve(1), _curve(2))
    assert parity["wilcoxon_p"] > 0.01 and parity["equivalent"] is True
    assert parity["ci95"][0] < parity["mean_difference"] < parity["ci95"][1]


def test_a_shifted_run_is_told_apart() -> None:
    parity = reward_parity(_curve(1, shift=0.1), _curve(2))
    assert parity["wilcoxon_p"] < 0.001 and not parity["equivalent"]
    assert parity["ci95"][0] > 0.05


def test_identical_curves_and_too_short_ones() -> None:
    assert reward_parity(_curve(1), _curve(1))["wilcoxon_p"] == 1.0
    with pytest.raises(ValueError, match="two steps"):
        reward_parity([0.5], [0.5])
