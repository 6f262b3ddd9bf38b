"""What the drafter misses at 0 draft steps, kept for its catch-up: contiguous positions per
request, the latest `max_tokens` of them, forgotten when a request leaves the batch or is
prefilled again, and handed out only when they end where the request's sequence does."""

from __future__ import annotations

import pytest
import torch

from rollout_server.draft_catch_up import MissedDraftInputs


def _keep(missed: MissedDraftInputs, rids: list[str], positions: list[int]) -> None:
    hidden = torch.tensor([[float(p)] for p in positions])
    missed.keep(rids, positions, hidden, [p + 1000 for p in positions])


def test_keeps_each_requests_positions_and_hands_them_out_once() -> None:
    missed = MissedDraftInputs(max_tokens=8)
    for step in range(3):
        _keep(missed, ["a", "b"], [10 + step, 20 + step])
    taken = missed.take(["b", "a"], [23, 13])
    assert [i for i, _ in taken] == [0, 1]
    b = taken[0][1]
    assert (b.start, b.end, b.tokens) == (20, 23, [1020, 1021, 1022])
    assert [float(row) for row in b.hidden] == [20.0, 21.0, 22.0]
    assert missed.take(["a", "b"], [13, 23]) == []


def test_only_the_latest_positions_are_kept() -> None:
    missed = MissedDraftInputs(max_tokens=2)
    for position in range(5):
        _keep(missed, ["a"], [position])
    (_, entry), = missed.take(["a"], [5])
    assert (entry.start, entry.tokens) == (3, [1003, 1004])


def test_a_gap_starts_over_and_leaving_the_batch_or_a_prefill_forgets() -> None:
    missed = MissedDraftInputs(max_tokens=8)
    _keep(missed, ["a", "b", "c"], [5, 7, 9])
    _keep(missed, ["a", "b"], [9, 8])  # a was retracted and prefilled again; c finished
    assert len(missed) == 2
    missed.forget(["b"])
    (_, entry), = missed.take(["a", "b"], [10, 9])
    assert (entry.start, entry.tokens) == (9, [1009])


def test_inputs_that_do_not_end_at_the_sequence_are_not_used() -> None:
    missed = MissedDraftInputs(max_tokens=8)
    _keep(missed, ["a"], [4])
    assert missed.take(["a"], [7]) == []
    assert len(missed) == 0


def test_validation() -> None:
    with pytest.raises(ValueError):
        MissedDraftInputs(max_tokens=0)
    with pytest.raises(ValueError):
        MissedDraftInputs(max_tokens=4).keep(["a", "b"], [1], torch.zeros(1, 1), [1])
