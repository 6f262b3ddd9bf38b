"""GRPO as DESIGN.md states it, with DAPO's options: G samples per prompt, advantages normalised
within each prompt's group, a clipped importance ratio against the rollout's own log-probabilities
(asymmetric clip: "clip-higher"), an optional KL penalty to a reference policy (k3 estimator),
and a token-level loss (every response token of the batch weighs the same). Zero-variance groups
carry no signal and can be dropped; truncated ("overlong") responses can be masked or penalised.
Plain PyTorch over tensors: the trainer feeds it, tests check it against hand computations."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tlt.jobs.spec import GrpoConfig


@dataclass
class ScoredGroup:
    """Rewards of the G samples of one prompt, and which of them were cut at the token limit."""

    rewards: list[float]
    lengths: list[int]
    truncated: list[bool]


def shaped_rewards(group: ScoredGroup, config: GrpoConfig, max_new_tokens: int) -> list[float]:
    """Rewards after the overlong option: DAPO's soft penalty grows linearly over the last
    `overlong_buffer` tokens before the limit (and is -1 for a truncated response)."""
    if config.overlong != "penalty":
        return list(group.rewards)
    start = max_new_tokens - config.overlong_buffer
    shaped = []
    for reward, length, cut in zip(group.rewards, group.lengths, group.truncated, strict=True):
        penalty = 1.0 if cut else max(0.0, (length - start) / config.overlong_buffer)
        shaped.append(reward - min(1.0, penalty))
    return shaped


def group_advantages(rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """(groups, G) rewards -> (groups, G) advantages: reward minus its group's mean, divided by the
    group's (unbiased) std when `normalize_std`. A zero-variance group gets zeros."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not normalize_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """(groups,) bool: groups whose rewards differ (the others have zero advantage everywhere)."""
    return rewards.max(dim=1).values > rewards.min(dim=1).values


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(B, T, V) logits and (B, T) ids -> (B, T-1): log-probability of token t+1 given the prefix,
    under the distribution sampled from, softmax(logits / temperature) (float32 whatever the logits)."""
    scaled = logits[:, :-1].float() / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GrpoConfig,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate (+ KL): all (B, L) over response positions; `advantages` (B,)
    or (B, L); `mask` 1 for response tokens that count. Returns (loss, metrics)."""
    mask = mask.float()
    tokens = mask.sum().clamp(min=1.0)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        metrics = {
            "clip_fraction": float(((unclipped != clipped).float() * mask).sum() / tokens),
            "ratio_mean": float((ratio * mask).sum() / tokens),
        }
    if config.kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        log_ratio = ref_logprobs - logprobs
        kl = torch.exp(log_ratio) - log_ratio - 1.0  # k3: unbiased, non-negative
        per_token = per_token + config.kl_coef * kl
        metrics["kl"] = float((kl.detach() * mask).sum() / tokens)
    loss = (per_token * mask).sum() / tokens
    metrics["loss"] = float(loss.detach())
    return loss, metrics
