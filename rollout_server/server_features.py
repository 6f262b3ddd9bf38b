"""The policy's features (last hidden states after the final norm) for drafter training, computed
by the rollout server itself through SGLang's `return_hidden_states`: the spot worker needs no
copy of the policy of its own, and the features always come from the policy version the server
serves. The server must run with `--enable-return-hidden-states`."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import requests
import torch

# Request ids of feature requests: the sample recorder does not take them for rollouts.
FEATURES_RID_PREFIX = "tlt-features-"


class FeaturesUnavailable(RuntimeError):
    """The server answered without hidden states (not started with --enable-return-hidden-states)."""


class ServerFeatures:
    """`features(token_ids) -> (T, H)` float32 tensor from one prefill on the rollout server;
    `features.many([...])` computes several sequences in one request (one batched prefill)."""

    def __init__(self, server_url: str, timeout_s: float = 120.0) -> None:
        self.server_url, self.timeout_s = server_url.rstrip("/"), timeout_s
        self._session = requests.Session()

    def __call__(self, token_ids: Sequence[int]) -> torch.Tensor:
        return self.many([token_ids])[0]

    def many(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Features of each sequence, in order."""
        rids = [f"{FEATURES_RID_PREFIX}{uuid.uuid4().hex}" for _ in sequences]
        body = {
            "rid": rids,
            "input_ids": [list(ids) for ids in sequences],
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_hidden_states": True,
            # A prefix-cache hit would skip the cached tokens' forward pass and return only the rest;
            # a salt of its own keeps each prefill from matching anything cached.
            "cache_salt": rids,
        }
        answer = self._session.post(f"{self.server_url}/generate", json=body, timeout=self.timeout_s)
        answer.raise_for_status()
        return [_rows(result, len(ids), self.server_url) for result, ids in zip(answer.json(), sequences, strict=True)]


def _rows(result: dict, length: int, server_url: str) -> torch.Tensor:
    hidden = result.get("meta_info", {}).get("hidden_states")
    if not hidden:
        raise FeaturesUnavailable(f"{server_url} returned no hidden states: start it with --enable-return-hidden-states")
    # One entry per forward pass (the prefill, possibly in chunks, then decode steps): (T, H) rows.
    rows = [row for entry in hidden for row in (entry if isinstance(entry[0], list) else [entry])]
    if len(rows) < length:
        raise FeaturesUnavailable(f"{len(rows)} hidden-state rows for {length} tokens")
    return torch.tensor(rows[:length], dtype=torch.float32)
