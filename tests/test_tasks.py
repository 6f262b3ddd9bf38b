"""The subtractive-Euclid task: solutions, rewards, split, and its heavy-tailed length."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tlt.tasks import GcdProblem, GcdTask
from tlt.tasks.gcd import parse_answer


@pytest.mark.parametrize("a, b", [(84, 36), (97, 2), (1, 99), (13, 8)])
def test_solution_walks_to_the_gcd(a: int, b: int) -> None:
    problem = GcdProblem(a, b)
    steps = problem.steps()
    assert steps[-1] == (math.gcd(a, b), math.gcd(a, b))
    for (x0, y0), (x1, y1) in zip([(a, b), *steps], steps):
        assert (x1, y1) in {(x0 - y0, y0), (x0, y0 - x0)}
    assert problem.solution().endswith(f"={math.gcd(a, b)}")
    assert problem.reward(problem.solution()) == 1.0


def test_example_from_the_docs() -> None:
    assert GcdProblem(84, 36).solution() == "48,36;12,36;12,24;12,12=12"


@pytest.mark.parametrize("response", ["48,36;12,36=13", "48,36;12,36", "", "=12x", "12,12=12=3"])
def test_wrong_or_unfinished_answers_get_no_reward(response: str) -> None:
    assert GcdProblem(84, 36).reward(response) == 0.0


def test_parse_answer() -> None:
    assert parse_answer("1,1=1") == 1
    assert parse_answer("3,3=3\n") == 3
    assert parse_answer("3,3") is None


def test_splits_are_disjoint_and_seeded() -> None:
    task = GcdTask()
    train = set(task.sample(3000, seed=0, split="train"))
    test = set(task.sample(300, seed=0, split="test"))
    assert not train & test
    assert task.sample(50, seed=3) == task.sample(50, seed=3)
    assert task.sample(50, seed=3) != task.sample(50, seed=4)


def test_solution_lengths_are_heavy_tailed() -> None:
    lengths = np.array([len(p.solution()) for p in GcdTask().sample(5000, seed=0)])
    assert np.percentile(lengths, 99) >= 4 * np.median(lengths)


def test_tail_time_share() -> None:
    from tlt.rollout.stats import tail_time_share

    # 9 of 10 responses done at 1 s, the last at 10 s: 90% of the time is the tail.
    assert tail_time_share([1.0] * 9 + [10.0]) == pytest.approx(0.9)
    assert tail_time_share([1.0, 2.0, 3.0, 4.0], done_fraction=0.5) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        tail_time_share([])
