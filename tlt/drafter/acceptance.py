"""Offline acceptance of a drafter: how many tokens a chain of `steps` drafts would have gained
per verification, measured against the policy's own greedy sequences (no serving engine needed).

At a response position p, the draft reads the true context (x_{t+1}, f_t) for t <= p, then feeds
its own tokens and features back for `steps` steps. Under greedy verification the drafts are
accepted up to the first one that differs from the policy's greedy token; the verify step adds
one token of its own, so the accept length is accepted drafts + 1 (SGLang's accept-length
convention), between 1 and steps + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tlt.drafter.model import EagleDrafter, PolicyParts
from tlt.drafter.training import PolicySequence, mixed_precision


@torch.no_grad()
def chain_accept_lengths(
    drafter: EagleDrafter,
    parts: PolicyParts,
    sequence: PolicySequence,
    features: torch.Tensor,
    steps: int,
    starts: Sequence[int],
) -> list[int]:
    """Accept length at each start position p (a response position with `steps` tokens after).

    All starts draft together, one drafter forward per draft step: the true positions come
    first, then each draft step's positions of the starts still accepting, each attending to its
    start's true prefix and its own earlier drafts only. The drafter has one layer, so a
    position's keys and values depend on its own input alone and this equals drafting each start
    on its own prefix (in a loop that costs `len(starts)` times as many forwards)."""
    if not starts:
        return []
    device = features.device
    ids = torch.tensor(sequence.token_ids, device=device)
    start = torch.tensor(list(starts), device=device)
    width = int(start.max()) + 1  # true positions 0..max p: token x_{t+1} with feature f_t
    true_tokens, true_feats = ids[1 : width + 1], features[:width]
    accepted = torch.zeros(len(start), dtype=torch.long, device=device)
    alive = torch.arange(len(start), device=device)  # the starts whose drafts all matched so far
    blocks: list[tuple[torch.Tensor, torch.Tensor]] = []  # per draft step after the first: (tokens, features) of `alive`
    for i in range(steps):
        p = start[alive]
        tokens = torch.cat([true_tokens, *(t for t, _ in blocks)])
        feats = torch.cat([true_feats, *(f for _, f in blocks)])
        positions = torch.cat([torch.arange(width, device=device), *(p + 1 + b for b in range(len(blocks)))])
        embeds = parts.embed_tokens(tokens)[None]
        mask = _draft_mask(width, p, len(blocks))
        with mixed_precision(device):
            hidden = drafter(embeds, feats[None], parts.position_embeddings(embeds, positions[None]), mask)[0]
            predicted = hidden[p] if not blocks else hidden[width + (len(blocks) - 1) * len(p) :]
            draft = parts.lm_head(predicted).argmax(-1)
        match = draft == ids[p + 2 + i]
        accepted[alive[match]] += 1
        if i == steps - 1 or not bool(match.any()):
            break
        alive = alive[match]
        blocks = [(t[match], f[match]) for t, f in blocks]
        blocks.append((draft[match], predicted[match].to(feats.dtype)))
    return (accepted + 1).tolist()


def _draft_mask(width: int, anchors: torch.Tensor, depth: int) -> torch.Tensor:
    """(1, 1, W, W) boolean: true positions causal among themselves; the draft position of block
    b for start s (p = anchors[s]) sees true positions <= p and blocks <= b of the same start."""
    device = anchors.device
    n = len(anchors)
    owner = torch.cat([torch.full((width,), -1, device=device), torch.arange(n, device=device).repeat(depth)])
    block = torch.cat([torch.full((width,), -1, device=device), torch.arange(depth, device=device).repeat_interleave(n)])
    anchor = torch.cat([torch.arange(width, device=device), anchors.repeat(depth)])
    sees_true = torch.arange(width, device=device)[None, :] <= anchor[:, None]
    sees_draft = (owner[:, None] == owner[None, width:]) & (block[None, width:] <= block[:, None])  # true rows own -1
    return torch.cat([sees_true, sees_draft], dim=1)[None, None]


def response_starts(sequence: PolicySequence, steps: int, every: int = 1) -> list[int]:
    """Start positions p whose `steps` following tokens are all response tokens."""
    first = max(sequence.prompt_len - 2, 0)
    last = len(sequence.token_ids) - steps - 2
    return list(range(first, last + 1, every))
