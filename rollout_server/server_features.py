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
    """`features(token_ids) -> (T, H)` float32 tensor from one prefill on the rollout server."""

    def __init__(self, server_url: str, timeout_s: float = 120.0) -> None:
        self.server_url, self.timeout_s = server_url.rstrip("/"), timeout_s
        self._session = requests.Session()

    def __call__(self, token_ids: Sequence[int]) -> torch.Tensor:
        rid = f"{FEATURES_RID_PREFIX}{uuid.uuid4().hex}"
        body = {
            "rid": rid,
            "input_ids": list(token_ids),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_hidden_states": True,
            # A prefix-cache hit would skip the cached tokens' forward pass and return only the rest;
            # a salt of its own keeps this prefill from matching anything cached.
            "cache_salt": rid,
        }
        answer = self._session.post(f"{self.server_url}/generate", json=body, timeout=self.timeout_s)
        answer.raise_for_status()
        hidden = answer.json().get("meta_info", {}).get("hidden_states")
        if not hidden:
            raise FeaturesUnavailable(f"{self.server_url} returned no hidden states: start it with --enable-return-hidden-states")
        # One entry per forward pass (the prefill, possibly in chunks, then decode steps): (T, H) rows.
        rows = [row for entry in hidden for row in (entry if isinstance(entry[0], list) else [entry])]
        if len(rows) < len(token_ids):
            raise FeaturesUnavailable(f"{len(rows)} hidden-state rows for {len(token_ids)} tokens")
        return torch.tensor(rows[: len(token_ids)], dtype=torch.float32)
