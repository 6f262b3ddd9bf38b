"""Whether a candidate drafter accepts more than its base: a paired comparison over the same
held-out sequences and positions, with a standard error that treats each sequence as one cluster
(positions of one sequence share its context, so they are not independent draws). The error is
estimated from the clusters themselves, so the test compares the gain with Student's t on one
fewer degrees of freedom than clusters: from a handful of sequences the error itself is too
uncertain for a normal threshold."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class PairedGain:
    """Mean accept length of base and candidate over the same positions, and the gain's error."""

    base: float
    candidate: float
    standard_error: float
    sequences: int
    positions: int

    @property
    def gain(self) -> float:
        return self.candidate - self.base

    def critical(self, z: float) -> float:
        """Standard errors the gain must reach for a one-sided test at the level a normal `z`
        has: Student's t on `sequences - 1` degrees of freedom (infinite below two sequences)."""
        if self.sequences < 2:
            return math.inf
        return float(stats.t.isf(stats.norm.sf(z), self.sequences - 1))

    def beats(self, z: float) -> bool:
        """The gain is positive and at least `critical(z)` standard errors."""
        return self.gain > 0 and self.gain >= self.critical(z) * self.standard_error


def paired_gain(base: Mapping[str, Sequence[int]], candidate: Mapping[str, Sequence[int]]) -> PairedGain:
    """Compare per-position accept lengths of the sequences both measured (the same positions,
    in the same order). The gain is a ratio estimator (summed differences over positions); its
    standard error is the cluster-robust one over sequences, infinite with fewer than two (no
    verdict from one sequence)."""
    names = [name for name in base if name in candidate and len(base[name]) == len(candidate[name]) and base[name]]
    if not names:
        raise ValueError("no held-out sequence measured by both drafters")
    positions = sum(len(base[n]) for n in names)
    base_sum = sum(sum(base[n]) for n in names)
    cand_sum = sum(sum(candidate[n]) for n in names)
    gain = (cand_sum - base_sum) / positions
    k = len(names)
    if k < 2:
        error = math.inf
    else:
        residuals = [sum(candidate[n]) - sum(base[n]) - gain * len(base[n]) for n in names]
        error = math.sqrt(k / (k - 1) * sum(r * r for r in residuals)) / positions
    return PairedGain(base=base_sum / positions, candidate=cand_sum / positions, standard_error=error, sequences=k, positions=positions)
