"""Learning parity of two runs of one job: do their training-reward curves differ?

Sampled runs draw different tokens, so their curves differ step by step even when the sampled
distributions are the same (which the speculative-sampling tests check token by token). Paired by
step (same prompts), a Wilcoxon signed-rank test asks whether one run's rewards sit systematically
above the other's, and the mean paired difference with its 95% t-interval says by how much at most.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy import stats

EQUIVALENCE_MARGIN = 0.05  # reward difference a user would not care about on this task


def reward_parity(first: Sequence[float], second: Sequence[float]) -> dict:
    """Paired comparison of two per-step reward curves (the common prefix of steps)."""
    n = min(len(first), len(second))
    if n < 2:
        raise ValueError("parity needs at least two steps of each run")
    diffs = [a - b for a, b in zip(first[:n], second[:n], strict=True)]
    mean = statistics.fmean(diffs)
    spread = statistics.stdev(diffs)
    half_width = float(stats.t.ppf(0.975, n - 1)) * spread / math.sqrt(n)
    # All-equal differences (identical runs) leave the signed-rank test nothing to rank.
    p_value = 1.0 if not any(diffs) else float(stats.wilcoxon(diffs).pvalue)
    return {
        "steps": n,
        "mean_difference": mean,
        "ci95": [mean - half_width, mean + half_width],
        "wilcoxon_p": p_value,
        "equivalent_within": EQUIVALENCE_MARGIN,
        "equivalent": abs(mean) + half_width <= EQUIVALENCE_MARGIN,
    }
