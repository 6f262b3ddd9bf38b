"""The rollout server's history source (`rollout_server.history_source`) on request objects shaped
like SGLang's `Req`: lazy feeding, prompt groups, finished and aborted requests, and the chain
layout handed to SGLang's verify-input builder."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rollout_server.history_source import ServerHistory, chain_outputs, group_of


class FINISH_ABORT:  # SGLang's class name, which the source recognises
    pass


class FINISH_LENGTH:
    pass


@dataclass
class FakeSampling:
    custom_params: dict | None = None


@dataclass
class FakeReq:
    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    sampling_params: FakeSampling = field(default_factory=FakeSampling)
    finished_reason: object | None = None

    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def output_ids_through_stop(self) -> list[int]:
        return self.output_ids


PROMPT = [1, 2, 3]
FILLER = torch.tensor([99])


def test_a_finished_sibling_drafts_for_the_next_request_of_its_prompt() -> None:
    history = ServerHistory()
    first = FakeReq("a", PROMPT, [10, 11, 12, 13, 14], finished_reason=FINISH_LENGTH())
    history.observe_finished([first])
    second = FakeReq("b", PROMPT, [10])
    assert history.drafts([second], 3, FILLER).tolist() == [[11, 12, 13]]
    other_prompt = FakeReq("c", [7, 8, 9], [10])
    assert history.drafts([other_prompt], 3, FILLER).tolist() == [[99, 99, 99]], "no history: filler"
    assert history.proposed == 3 and history.requested == 6


def test_live_requests_are_fed_lazily_with_their_new_tokens() -> None:
    history = ServerHistory()
    req = FakeReq("a", PROMPT, [5, 6, 7])
    history.drafts([req], 2, FILLER)
    req.output_ids += [5, 6]  # the response repeats itself
    assert history.drafts([req], 2, FILLER).tolist() == [[7, 5]]
    assert history.running == 1


def test_a_group_id_in_custom_params_joins_different_prompts() -> None:
    history = ServerHistory()
    done = FakeReq("a", [1, 2, 3], [4, 5, 6, 7], FakeSampling({"tlt_group": "g"}), FINISH_LENGTH())
    history.observe_finished([done])
    # Same group, a prompt with the same tail: drafts from the group's response.
    assert history.drafts([FakeReq("b", [0, 2, 3], [4], FakeSampling({"tlt_group": "g"}))], 2, FILLER).tolist() == [[5, 6]]
    assert group_of(done) == ("group", "g") and group_of(FakeReq("c", [1])) == ("prompt", (1,))


def test_aborted_requests_leave_no_history_and_ends_count_once() -> None:
    history = ServerHistory()
    aborted = FakeReq("a", PROMPT, [10, 11, 12])
    history.drafts([aborted], 2, FILLER)
    aborted.finished_reason = FINISH_ABORT()
    history.observe_finished([aborted])
    assert history.running == 0
    assert history.drafts([FakeReq("b", PROMPT, [10])], 2, FILLER).tolist() == [[99, 99]]
    done = FakeReq("c", PROMPT, [20, 21, 22], finished_reason=FINISH_LENGTH())
    history.observe_finished([done])
    history.observe_finished([done])  # SGLang streams a finished request again: recorded once
    assert history.drafter.tokens_held == 2 * (len(PROMPT) + 3)  # its group's copy and the recent window's


def test_non_rollout_generations_are_not_history() -> None:
    history = ServerHistory()
    history.observe_finished([FakeReq("HEALTH_CHECK_1", PROMPT, [10, 11], finished_reason=FINISH_LENGTH())])
    assert history.drafter.groups == 0


def test_the_chain_layout_is_sglangs_top1_layout() -> None:
    """SGLang preallocates a top-1 chain's parents as arange(-1, steps - 1) and its score indices as
    arange(steps) per request (`base_spec_worker`), none for a single step."""
    chain = torch.tensor([[4, 5, 6], [7, 8, 9]])
    parents, scores, tokens, probs = chain_outputs(chain)
    assert parents.tolist() == [[-1, 0, 1]] * 2 and scores.tolist() == [[0, 1, 2]] * 2
    assert tokens is chain and probs is None
    parents, scores, _, _ = chain_outputs(torch.tensor([[4]]))
    assert parents.shape == (1, 0) and scores.tolist() == [[0]]
