"""Sampled draft verification on the CPU: every committed token is an exact draw from the target
distribution (chi-square over many draws), and the same test fails for a biased acceptance rule."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from rollout_server.cpu import sampling

VOCAB = 6


def _tree(topk_children: int):
    """Root 0 with `topk_children` children (nodes 1..k, distinct tokens); node 1 has a child."""
    n = topk_children + 2
    candidates = torch.tensor([[0, *range(1, topk_children + 1), 2]])
    next_token = torch.full((1, n), -1)
    next_sibling = torch.full((1, n), -1)
    next_token[0, 0] = 1
    for child in range(1, topk_children):
        next_sibling[0, child] = child + 1
    next_token[0, 1] = n - 1
    return candidates, torch.arange(n)[None, :], next_token, next_sibling


def _first_tokens(target: torch.Tensor, topk_children: int, draws: int, seed: int, threshold_acc: float = 1.0):
    """The token committed right after the root in `draws` independent verifications."""
    candidates, index, next_token, next_sibling = _tree(topk_children)
    n = candidates.shape[1]
    probs = target.expand(1, n, VOCAB).contiguous()
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB)
    for _ in range(draws):
        predicts = torch.zeros(n, dtype=torch.int32)
        accept_index = torch.full((1, 3), -1, dtype=torch.int32)
        accepted = torch.zeros(1, dtype=torch.int32)
        sampling.tree_speculative_sampling_target_only_cpu(
            predicts, accept_index, accepted, candidates, index, next_token, next_sibling,
            torch.rand(1, n, generator=gen), torch.rand(1, generator=gen), probs, torch.zeros_like(probs),
            threshold_acc=threshold_acc,
        )  # fmt: skip
        counts[int(predicts[0])] += 1
        assert int(accepted[0]) in (0, 1, 2)
    return counts


TARGET = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])


@pytest.mark.parametrize("children", [1, 3])
def test_committed_tokens_follow_the_target_distribution(children: int) -> None:
    counts = _first_tokens(TARGET, children, draws=4000, seed=children)
    assert chisquare(counts, TARGET * counts.sum()).pvalue > 1e-4


@pytest.mark.parametrize("children", [1, 3])
def test_the_test_catches_a_biased_acceptance_rule(children: int) -> None:
    # SGLang's accept-threshold knob, set to accept drafts twice as often as exactness allows.
    counts = _first_tokens(TARGET, children, draws=4000, seed=children, threshold_acc=0.5)
    assert chisquare(counts, TARGET * counts.sum()).pvalue < 1e-6


def test_fully_accepted_chains_commit_drafts_and_sample_the_bonus_from_the_last_node() -> None:
    candidates, index, next_token, next_sibling = _tree(1)
    probs = torch.zeros(1, 3, VOCAB)
    probs[0, 0, 1] = 1.0  # root: certainly token 1 (the draft at node 1)
    probs[0, 1, 2] = 1.0  # node 1: certainly token 2 (the draft at node 2)
    probs[0, 2, 5] = 1.0  # node 2: the bonus token is 5
    predicts = torch.zeros(3, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accepted = torch.zeros(1, dtype=torch.int32)
    sampling.tree_speculative_sampling_target_only_cpu(
        predicts, accept_index, accepted, candidates, index, next_token, next_sibling,
        torch.full((1, 3), 0.5), torch.tensor([0.3]), probs, torch.zeros_like(probs),
    )  # fmt: skip
    assert accepted.tolist() == [2]
    assert accept_index.tolist() == [[0, 1, 2]]
    assert predicts.tolist() == [1, 2, 5]


def test_top_k_and_top_p_renormalisation_match_sglangs_pytorch_sampler() -> None:
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    top_k = sampling.top_k_renorm_prob(probs, torch.tensor([2, 0]))
    torch.testing.assert_close(top_k, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7], [0.25, 0.25, 0.25, 0.25]]))
    # Nucleus: keep tokens whose preceding mass is <= top_p (0.4, then 0.3 since 0.4 <= 0.5).
    top_p = sampling.top_p_renorm_prob(probs, torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(top_p, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7], [0.25, 0.25, 0.25, 0.25]]))
