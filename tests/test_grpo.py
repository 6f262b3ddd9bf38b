"""GRPO's pieces against hand computations: group advantages, the clipped token-level surrogate
(gradients vanish exactly where the clip binds), the k3 KL, overlong shaping and per-token
log-probabilities of a real transformers model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tlt.jobs.spec import GrpoConfig
from tlt.paths import BUNDLED_MODEL
from trainer.grpo import (
    ScoredGroup,
    group_advantages,
    grpo_loss,
    informative_groups,
    shaped_rewards,
    token_logprobs,
)


def test_advantages_are_normalised_within_each_group() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    adv = group_advantages(rewards)
    std = torch.tensor(1 / 3).sqrt()  # unbiased std of [1, 0, 0, 1]: sqrt(4 x 0.25 / 3)
    torch.testing.assert_close(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / std, atol=1e-5, rtol=1e-5)
    assert torch.equal(adv[1], torch.zeros(4))
    torch.testing.assert_close(adv[2].sum(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(group_advantages(rewards, normalize_std=False)[2], torch.tensor([-0.75, -0.75, -0.75, 2.25]))
    assert informative_groups(rewards).tolist() == [True, False, True]


def test_at_ratio_one_the_loss_is_minus_the_token_mean_advantage() -> None:
    logprobs = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]])).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    advantages = torch.tensor([2.0, -1.0])
    loss, metrics = grpo_loss(logprobs, logprobs.detach(), advantages, mask, GrpoConfig())
    # token level: (2 + 2 - 1 - 1 - 1) / 5 tokens
    assert loss.item() == pytest.approx(-(2 + 2 - 1 - 1 - 1) / 5)
    loss.backward()
    expected = -torch.tensor([[2.0, 2.0, 0.0], [-1.0, -1.0, -1.0]]) / 5
    torch.testing.assert_close(logprobs.grad, expected)
    assert metrics["clip_fraction"] == 0.0


def test_the_clip_stops_gradients_only_where_it_binds() -> None:
    config = GrpoConfig(clip_low=0.2, clip_high=0.28)
    old = torch.zeros(1, 4)
    # ratios 1.5 (A>0: clipped), 1.1 (A>0: free), 0.5 (A<0: clipped), 0.5 (A>0: min keeps the unclipped)
    logprobs = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.5]])).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    loss, metrics = grpo_loss(logprobs, old, advantages, torch.ones(1, 4), config)
    loss.backward()
    grad = logprobs.grad[0]
    assert grad[0] == 0.0 and grad[2] == 0.0
    assert grad[1] == pytest.approx(-1.1 / 4) and grad[3] == pytest.approx(-0.5 / 4)
    assert metrics["clip_fraction"] == pytest.approx(3 / 4)  # the last token: clipped value differs, min picks unclipped
    assert loss.item() == pytest.approx(-(1.28 + 1.1 - 0.8 + 0.5) / 4)


def test_kl_is_the_k3_estimate_and_needs_a_reference() -> None:
    logprobs = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.5, 0.5]]))
    config = GrpoConfig(kl_coef=0.1)
    loss, metrics = grpo_loss(logprobs, logprobs, torch.zeros(1), torch.ones(1, 2), config, ref_logprobs=ref)
    k3 = (2.0 - torch.log(torch.tensor(2.0)) - 1.0).item()  # second token; the first is 0
    assert metrics["kl"] == pytest.approx(k3 / 2) and loss.item() == pytest.approx(0.1 * k3 / 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, logprobs, torch.zeros(1), torch.ones(1, 2), config)


def test_overlong_penalty_is_linear_in_the_buffer() -> None:
    group = ScoredGroup(rewards=[1.0, 1.0, 1.0, 0.0], lengths=[10, 80, 100, 100], truncated=[False, False, False, True])
    config = GrpoConfig(overlong="penalty", overlong_buffer=40)
    assert shaped_rewards(group, config, max_new_tokens=100) == pytest.approx([1.0, 0.5, 0.0, -1.0])
    assert shaped_rewards(group, GrpoConfig(overlong="filter"), max_new_tokens=100) == group.rewards


def test_token_logprobs_of_a_transformers_model() -> None:
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 5, 7, 2, 9]])
    with torch.no_grad():
        logits = model(ids).logits
        got = token_logprobs(logits, ids)
        cooled = token_logprobs(logits, ids, temperature=0.7)
    for t in range(4):
        expected = torch.log_softmax(logits[0, t], -1)[ids[0, t + 1]]
        assert got[0, t].item() == pytest.approx(expected.item(), abs=1e-6)
        expected = torch.log_softmax(logits[0, t] / 0.7, -1)[ids[0, t + 1]]
        assert cooled[0, t].item() == pytest.approx(expected.item(), abs=1e-6)
