"""The history drafter: what it drafts from each source, and that its memory stays bounded."""

from __future__ import annotations

import random

import pytest

from tlt.speculation.history import HistoryConfig, HistoryDrafter, TokenIndex

PROMPT = [101, 102, 103, 104, 105]


def _drafter(**config: int) -> HistoryDrafter:
    return HistoryDrafter(HistoryConfig(**config))


def test_a_response_drafts_from_its_own_prefix() -> None:
    drafter = _drafter(key_len=2)
    drafter.start("r", "g", PROMPT)
    drafter.extend("r", [1, 2, 3, 4, 9, 1, 2])
    draft = drafter.propose("r", 3)
    assert draft.tokens == (3, 4, 9) and draft.match_len == 2


def test_no_match_drafts_nothing() -> None:
    drafter = _drafter(key_len=2)
    drafter.start("r", "g", PROMPT)
    drafter.extend("r", [1, 2, 3])
    assert drafter.propose("r", 4).tokens == ()
    assert drafter.propose("r", 4).match_len == 0


def test_a_response_drafts_from_its_prompt() -> None:
    drafter = _drafter(key_len=2)
    drafter.start("r", "g", [7, 8, 9, 10, 11, 12])
    drafter.extend("r", [50, 8, 9])
    assert drafter.propose("r", 2).tokens == (10, 11)


def test_a_live_sibling_is_drafted_from_as_it_grows() -> None:
    drafter = _drafter(key_len=2)
    drafter.start("a", "g", PROMPT)
    drafter.start("b", "g", PROMPT)
    # At the start of a response the prompt's end is the context: b drafts a's first tokens.
    drafter.extend("a", [1, 2, 3])
    assert drafter.propose("b", 3).tokens == (1, 2, 3)
    drafter.extend("a", [4, 5, 6])
    drafter.extend("b", [1, 2, 3, 4])
    assert drafter.propose("b", 8).tokens == (5, 6)  # a's live end: nothing further yet


def test_the_longest_match_wins_and_the_most_recent_breaks_ties() -> None:
    index = TokenIndex(min_len=2, max_len=2, candidates=8)
    index.extend("old", [9, 1, 2, 30])
    index.extend("long", [7, 8, 1, 2, 40])
    index.extend("new", [5, 1, 2, 50])
    match = index.longest_match([7, 8, 1, 2], max_match=8)
    assert match is not None and match.length == 4 and match.draft(1).tokens == (40,)
    match = index.longest_match([6, 1, 2], max_match=8)
    assert match is not None and match.length == 2 and match.draft(1).tokens == (50,)


def test_earlier_epochs_of_a_prompt_are_drafted_from_and_other_prompts_are_not_mixed_in() -> None:
    drafter = _drafter(key_len=2, recent_tokens=0)
    drafter.start("epoch0", "g", PROMPT)
    drafter.extend("epoch0", [1, 2, 3, 4])
    drafter.finish("epoch0")
    drafter.start("other", "h", PROMPT)  # same tokens, another group: none of g's history
    drafter.start("epoch1", "g", PROMPT)
    assert drafter.propose("epoch1", 4).tokens == (1, 2, 3, 4)
    assert drafter.propose("other", 4).tokens == ()


def test_the_recent_window_serves_other_prompts() -> None:
    drafter = _drafter(key_len=2)
    drafter.start("a", "g", PROMPT)
    drafter.extend("a", [60, 61, 62, 63, 64])
    drafter.finish("a")
    drafter.start("b", "h", [1, 2, 3])
    drafter.extend("b", [60, 61])
    assert drafter.propose("b", 3).tokens == (62, 63, 64)


def test_an_aborted_response_is_forgotten_and_a_reused_request_id_starts_afresh() -> None:
    drafter = _drafter(key_len=2, recent_tokens=0)
    drafter.start("r", "g", PROMPT)
    drafter.extend("r", [1, 2, 3])
    drafter.abort("r")
    assert drafter.groups == 0 and drafter.tokens_held == 0
    drafter.start("r", "g", PROMPT)
    assert drafter.propose("r", 3).tokens == ()
    with pytest.raises(ValueError, match="already running"):
        drafter.start("r", "g", PROMPT)


def test_a_prompt_keeps_its_newest_responses() -> None:
    drafter = _drafter(key_len=2, responses_per_prompt=2, recent_tokens=0)
    for n in range(5):  # the fifth is more than twice the two kept: the group is re-indexed
        drafter.start(n, "g", PROMPT)
        drafter.extend(n, [n * 10 + i for i in range(8)])
        drafter.finish(n)
    assert drafter.tokens_held == 2 * 10  # each holds the prompt's last 2 tokens and its 8
    drafter.start("q", "g", PROMPT)
    drafter.extend("q", [2, 3])  # response 0's: dropped
    assert drafter.propose("q", 2).tokens == ()
    drafter.extend("q", [40, 41])  # response 4's: kept
    assert drafter.propose("q", 2).tokens == (42, 43)


def test_a_live_request_keeps_drafting_across_its_groups_reindexing() -> None:
    drafter = _drafter(key_len=2, responses_per_prompt=1, recent_tokens=0)
    drafter.start("live", "g", PROMPT)
    drafter.extend("live", [7, 8, 9, 7, 8])
    for n in range(3):
        drafter.start(n, "g", PROMPT)
        drafter.finish(n)
    drafter.extend("live", [9, 7])
    assert drafter.propose("live", 2).tokens == (8, 9)


def test_the_least_recently_used_prompts_are_dropped_beyond_the_token_budget() -> None:
    drafter = _drafter(key_len=2, history_tokens=25, recent_tokens=0)
    for group in ("g0", "g1", "g2"):
        drafter.start(group, group, PROMPT)
        drafter.extend(group, [1, 2, 3, 4, 5, 6, 7, 8])
        drafter.finish(group)
    assert drafter.groups == 2 and drafter.tokens_held == 20
    for group, expected in (("g0", ()), ("g2", (3, 4))):
        drafter.start("q" + group, group, PROMPT)
        drafter.extend("q" + group, [1, 2])
        assert drafter.propose("q" + group, 2).tokens == expected


def test_a_longer_key_beats_more_recent_shorter_matches() -> None:
    index = TokenIndex(min_len=1, max_len=3, candidates=2)
    index.extend("long", [1, 2, 3, 40])
    index.extend("short", [9, 3, 50, 8, 3, 60])
    match = index.longest_match([1, 2, 3], max_match=8)
    assert match is not None and match.length == 3 and match.draft(1).tokens == (40,)


def test_a_key_range_that_is_empty_is_refused() -> None:
    with pytest.raises(ValueError, match="min_match"):
        HistoryConfig(min_match=3, key_len=2)


@pytest.mark.slow
def test_memory_stays_bounded_over_100k_responses() -> None:
    """100k responses to 5k prompts: the tokens held, the groups and the index keys stop growing
    once the budgets are full (after about 5k responses)."""
    rng = random.Random(0)
    drafter = _drafter(history_tokens=20_000, recent_tokens=4_000)
    keys = []
    for n in range(100_000):
        group = n % 5_000
        drafter.start(n, group, [group, group + 1, group + 2])
        drafter.extend(n, [rng.randrange(2000) for _ in range(8)])
        drafter.propose(n, 4)
        drafter.finish(n)
        if n % 10_000 == 9_999:
            keys.append(drafter.index_keys)
    assert drafter.tokens_held <= 24_000
    assert drafter.groups <= 20_000 // 11 + 1
    # Random tokens: nearly every n-gram is a key of its own, about 5 per token held.
    assert max(keys) < 1.05 * min(keys[1:]) and max(keys) < 6 * 24_000, keys
