"""Summaries of a batch of rollouts: response-length percentiles and accuracy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel


class RolloutSummary(BaseModel):
    """Length distribution (tokens) and accuracy of a set of responses."""

    count: int
    accuracy: float
    p50: float
    p90: float
    p99: float
    max: int
    mean: float

    @property
    def tail_ratio(self) -> float:
        """p99 / median: how heavy the long tail is."""
        return self.p99 / self.p50 if self.p50 else float("inf")


def summarize(lengths: Sequence[int], rewards: Sequence[float]) -> RolloutSummary:
    """Summary of responses given their token lengths and rewards (1.0 = correct)."""
    if not lengths or len(lengths) != len(rewards):
        raise ValueError("need one reward per response and at least one response")
    arr = np.asarray(lengths, dtype=float)
    return RolloutSummary(
        count=len(lengths),
        accuracy=float(np.mean(rewards)),
        p50=float(np.percentile(arr, 50)),
        p90=float(np.percentile(arr, 90)),
        p99=float(np.percentile(arr, 99)),
        max=int(arr.max()),
        mean=float(arr.mean()),
    )


def tail_time_share(finish_times: Sequence[float], done_fraction: float = 0.9) -> float:
    """Share of a batch's wall time spent after `done_fraction` of its responses had finished:
    the long tail TLT speculates through."""
    if not finish_times or not 0 < done_fraction < 1:
        raise ValueError("need finish times and 0 < done_fraction < 1")
    ordered = sorted(finish_times)
    makespan = ordered[-1]
    at_fraction = ordered[max(0, int(np.ceil(done_fraction * len(ordered))) - 1)]
    return (makespan - at_fraction) / makespan if makespan > 0 else 0.0
