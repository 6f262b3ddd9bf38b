"""Sampled verification of speculative drafts on the CPU, in PyTorch.

Stock SGLang has no CPU kernel for it and falls back to *greedy* verification on the CPU even for
requests that sample (`eagle_utils._verify_uses_greedy`), so speculative decoding there silently
turns temperature-1 rollouts into argmax ones. For RL that is a different policy. These functions
follow the contract of SGLang's CUDA ops (`tree_speculative_sampling_target_only`, FlashInfer's
`top_k_renorm_prob` / `top_p_renorm_prob`), which the plugin installs where SGLang has None.

The acceptance rule, per node of the draft tree, with one uniform coin per accepted node: the
children are tried in order, child i is accepted when the coin falls below the target
probability mass of children 1..i; if none is, the next token is drawn from the target
distribution with the rejected children removed. Each committed token is thus an exact draw
from the target distribution (Leviathan et al. 2023; SpecInfer's multi-candidate variant).
"""

from __future__ import annotations

import torch

from rollout_server.cpu.ops import is_chain, write_chain_acceptance


def tree_speculative_sampling_target_only_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Verify each request's draft tree by sampling (argument names keep the CUDA op's spelling).

    Shapes: candidates / retrive_* / uniform_samples [B, N] (N draft tokens, node 0 the root);
    target_probs [B, N, V]; uniform_samples_for_final_sampling [B]; accept_index [B, S]. Writes the
    accepted flat token ids (`accept_index[b, 0]` is the root), their count without the root
    (`accept_token_num`), and into `predicts` (flat [B * N]) the token committed after every
    accepted node, the last one drawn from the residual distribution. `draft_probs` is unused:
    the drafts are treated as point proposals, like the CUDA op with zero draft probabilities.
    """
    del draft_probs, deterministic
    if is_chain(retrive_next_token, retrive_next_sibling):
        _verify_chains(
            predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
            uniform_samples_for_final_sampling, target_probs, threshold_single, threshold_acc,
        )  # fmt: skip
        return
    _verify_trees(
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
        threshold_single, threshold_acc,
    )  # fmt: skip


def _verify_trees(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
) -> None:
    """The acceptance rule on any tree, request by request."""
    batch = candidates.shape[0]
    max_accept = accept_index.shape[1]
    tokens, next_token, next_sibling = candidates.tolist(), retrive_next_token.tolist(), retrive_next_sibling.tolist()
    flat_index, coins = retrive_index.tolist(), uniform_samples.tolist()
    final_nodes, removed = [], []
    for b in range(batch):
        last = flat_index[b][0]
        accept_index[b, 0] = last
        node, accepted, rejected, coin = 0, 0, [], coins[b][0]
        for _ in range(1, max_accept):
            child, mass = next_token[b][node], 0.0
            rejected = []
            while child != -1:
                token = tokens[b][child]
                p = float(target_probs[b, node, token])
                mass += p
                if p > 0 and (coin < mass / threshold_acc or p >= threshold_single):
                    break
                rejected.append(token)
                child = next_sibling[b][child]
            if child == -1:
                break
            predicts[last] = tokens[b][child]
            accepted += 1
            last = flat_index[b][child]
            accept_index[b, accepted] = last
            node, coin, rejected = child, coins[b][child], []
        accept_token_num[b] = accepted
        final_nodes.append((b, node, last))
        removed.append(rejected)
    for (b, node, last), rejected in zip(final_nodes, removed):
        residual = target_probs[b, node].clone()
        if rejected:
            residual[rejected] = 0.0
        predicts[last] = _draw(residual, float(uniform_samples_for_final_sampling[b]))


def _verify_chains(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    target_probs: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
) -> None:
    """The acceptance rule for chains (node i's only child is i + 1), the whole batch at once:
    draft i + 1 is accepted with node i's coin against its target probability at node i, the
    leading run of acceptances commits, and the token after the last accepted node is drawn from
    that node's target distribution without the rejected draft (if one was rejected)."""
    batch, num_nodes = candidates.shape
    max_accept = min(accept_index.shape[1], num_nodes)
    drafts = candidates[:, 1:max_accept].long()  # [B, A]: the child of node i at column i
    p = target_probs[:, : max_accept - 1].gather(2, drafts.unsqueeze(2)).squeeze(2)
    accept = (p > 0) & ((coins[:, : max_accept - 1] < p / threshold_acc) | (p >= threshold_single))
    accepted = accept.long().cumprod(dim=1).sum(dim=1)
    write_chain_acceptance(accept_index, accept_token_num, retrive_index, accepted)
    committed = torch.arange(max_accept - 1)[None, :] < accepted[:, None]
    predicts[retrive_index[:, : max_accept - 1].long()[committed]] = drafts[committed].to(predicts.dtype)
    rows = torch.arange(batch)
    residual = target_probs[rows, accepted].clone()
    rejected = accepted < max_accept - 1  # the chain stopped at a draft, not at its end
    if bool(rejected.any()):
        residual[rows[rejected], drafts[rows[rejected], accepted[rejected]]] = 0.0
    last = retrive_index.long()[rows, accepted]
    predicts[last] = _draw_rows(residual, final_coins.reshape(-1)[:batch]).to(predicts.dtype)


def _draw_rows(weights: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """`_draw` for each row of [B, V] weights with its coin, as one batched search."""
    cumulative = torch.cumsum(weights.double(), dim=1)
    target = (coins.double() * cumulative[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cumulative, target, right=True).squeeze(1).clamp(max=weights.shape[1] - 1)
    edge = weights.gather(1, index.unsqueeze(1)).squeeze(1) <= 0
    for b in edge.nonzero().flatten().tolist():  # a coin on the upper edge: rare, fixed row by row
        index[b] = _draw(weights[b], float(coins[b]))
    return index


def _draw(weights: torch.Tensor, coin: float) -> int:
    """Inverse-CDF draw from unnormalised non-negative weights with a uniform coin in [0, 1)."""
    cumulative = torch.cumsum(weights.double(), dim=0)
    index = int(torch.searchsorted(cumulative, coin * cumulative[-1], right=True))
    index = min(index, len(weights) - 1)
    while weights[index] <= 0 and index > 0:  # the coin landed on the upper edge: last positive
        index -= 1
    return index


def _sorted_keep_mask(probs: torch.Tensor, keep_sorted) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = keep_sorted(sorted_probs)
    return torch.zeros_like(keep).scatter(-1, order, keep)


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Keep each row's `top_k` largest probabilities and renormalise (k <= 0 or >= V keeps all)."""
    ks = torch.as_tensor(top_k, device=probs.device).reshape(-1, 1).expand(probs.shape[0], 1)
    ks = torch.where((ks <= 0) | (ks >= probs.shape[-1]), probs.shape[-1], ks)
    ranks = torch.arange(probs.shape[-1], device=probs.device)
    kept = probs * _sorted_keep_mask(probs, lambda _: ranks[None, :] < ks)
    return kept / kept.sum(dim=-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Keep the most likely tokens up to and including the one that reaches mass `top_p`, and
    renormalise; the same nucleus as SGLang's PyTorch sampler (`(cumsum - p) <= top_p`)."""
    ps = torch.as_tensor(top_p, dtype=probs.dtype, device=probs.device).reshape(-1, 1)

    def keep(sorted_probs: torch.Tensor) -> torch.Tensor:
        return (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) <= ps

    kept = probs * _sorted_keep_mask(probs, keep)
    return kept / kept.sum(dim=-1, keepdim=True)
