"""The drafter-adaptation benchmark's figures from per-step metrics: the spot workers' cost is the
bundled arms' step-time ratio, the fresh drafter's learning its first against its last steps."""

from __future__ import annotations

import pytest

from benchmarks.drafter_adaptation import ARMS, arm_summary, comparison
from tlt.jobs.records import StepMetrics


def _steps(step_s: float, accept: list[float]) -> list[StepMetrics]:
    common = {"reward_mean": 0.5, "samples": 8, "groups_used": 2, "response_tokens": 100, "tail_s": 0.1, "loss": 0.0}
    common |= {"clip_fraction": 0.0, "speculated_fraction": 0.5, "resent": 0, "stale_samples": 0}
    times = {"rollout_s": step_s / 2, "train_s": step_s / 4, "publish_s": step_s / 4}
    return [
        StepMetrics(step=n, policy_version=n, spec_accept_length=a, drafter_version=1 + n // 3, **common, **times)
        for n, a in enumerate(accept)
    ]


def test_cost_and_learning_come_from_the_right_arms() -> None:
    flat = [3.5] * 6
    learning = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    arms = [_steps(4.0, flat), _steps(4.2, flat), _steps(5.0, [1.0] * 6), _steps(4.0, learning)]
    summaries = {name: arm_summary(steps) for name, steps in zip(ARMS, arms, strict=True)}
    figures = comparison(summaries)
    assert figures["spot_cost_bundled"] == pytest.approx(0.05)
    assert figures["fresh_step_ratio_frozen_over_spot"] == pytest.approx(1.25)
    assert figures["fresh_accept_first_to_last"] == pytest.approx([1.0, 2.5])  # mean of the last 5
    assert summaries["fresh drafter, spot training"]["drafter_versions"] == [1, 2]
