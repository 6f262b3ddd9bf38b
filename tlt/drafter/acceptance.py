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
    """Accept length at each start position p (a response position with `steps` tokens after)."""
    device = features.device
    ids = torch.tensor(sequence.token_ids, device=device)
    lengths = []
    for p in starts:
        tokens = ids[1 : p + 2].clone()  # x_1 .. x_{p+1}
        feats = features[: p + 1].clone()  # f_0 .. f_p
        accepted = 0
        for i in range(steps):
            width = len(tokens)
            embeds = parts.embed_tokens(tokens)[None]
            positions = torch.arange(width, device=device)[None]
            mask = torch.ones(width, width, dtype=torch.bool, device=device).tril()[None, None]
            with mixed_precision(device):
                predicted = drafter(embeds, feats[None], parts.position_embeddings(embeds, positions), mask)[0, -1]
                draft = int(parts.lm_head(predicted).argmax())
            if draft != int(ids[p + 2 + i]):
                break
            accepted += 1
            tokens = torch.cat([tokens, torch.tensor([draft], device=device)])
            feats = torch.cat([feats, predicted[None].to(feats.dtype)])
        lengths.append(accepted + 1)
    return lengths


def response_starts(sequence: PolicySequence, steps: int, every: int = 1) -> list[int]:
    """Start positions p whose `steps` following tokens are all response tokens."""
    first = max(sequence.prompt_len - 2, 0)
    last = len(sequence.token_ids) - steps - 2
    return list(range(first, last + 1, every))
