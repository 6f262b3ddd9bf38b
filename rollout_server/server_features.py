"""The policy's features (last hidden states after the final norm) for drafter training, computed
by the rollout server itself through SGLang's `return_hidden_states`: the spot worker needs no
copy of the policy of its own, and the features always come from the policy version the server
serves. The server must run with `--enable-return-hidden-states`.

They travel as a safetensors blob from the plugin's route `POST /tlt/features` (installed in
SGLang's HTTP process, beside `/generate`): a batch of a 7B policy's features is ~1e8 numbers,
which SGLang's own JSON answer would carry as text.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import requests
import torch
from fastapi import Request, Response  # at module level: FastAPI resolves the handler's annotations here
from safetensors.torch import load as load_blob
from safetensors.torch import save as save_blob

# Request ids of feature requests: the sample recorder does not take them for rollouts.
FEATURES_RID_PREFIX = "tlt-features-"
FEATURES_ROUTE = "/tlt/features"
MAX_SEQUENCES = 1024


class FeaturesUnavailable(RuntimeError):
    """The server answered without hidden states (not started with --enable-return-hidden-states)."""


def features_request(sequences: Sequence[Sequence[int]]) -> dict:
    """SGLang's `/generate` body that computes the features of these sequences in one batched prefill."""
    rids = [f"{FEATURES_RID_PREFIX}{uuid.uuid4().hex}" for _ in sequences]
    return {
        "rid": rids,
        "input_ids": [list(ids) for ids in sequences],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
        # A prefix-cache hit would skip the cached tokens' forward pass and return only the rest;
        # a salt of its own keeps each prefill from matching anything cached.
        "cache_salt": rids,
    }


def features_blob(results: Sequence[dict], sequences: Sequence[Sequence[int]]) -> bytes:
    """SGLang's answer to `features_request`, as the safetensors blob the route returns: "0", "1", ...
    each a (T, H) float32 tensor."""
    rows = {str(i): _rows(result, len(ids)) for i, (result, ids) in enumerate(zip(results, sequences, strict=True))}
    return save_blob(rows)


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
        body = {"input_ids": [list(ids) for ids in sequences]}
        answer = self._session.post(f"{self.server_url}{FEATURES_ROUTE}", json=body, timeout=self.timeout_s)
        if answer.status_code == 409:
            raise FeaturesUnavailable(f"{self.server_url}: {answer.text}")
        answer.raise_for_status()
        tensors = load_blob(answer.content)
        return [tensors[str(i)] for i in range(len(sequences))]


def _rows(result: dict, length: int) -> torch.Tensor:
    hidden = result.get("meta_info", {}).get("hidden_states")
    if not hidden:
        raise FeaturesUnavailable("no hidden states: start the server with --enable-return-hidden-states")
    # One entry per forward pass (the prefill, possibly in chunks, then decode steps): (T, H) rows.
    rows = [row for entry in hidden for row in (entry if isinstance(entry[0], list) else [entry])]
    if len(rows) < length:
        raise FeaturesUnavailable(f"{len(rows)} hidden-state rows for {length} tokens")
    return torch.tensor(rows[:length], dtype=torch.float32)


def install_features_route() -> None:
    """Add `POST /tlt/features` to SGLang's HTTP app: `{"input_ids": [[...], ...]}` in, a
    safetensors blob out (409 when the server does not return hidden states, 400 on bad input)."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.io_struct import GenerateReqInput

    async def features(request: Request) -> Response:
        body = await request.json()
        sequences = body.get("input_ids") if isinstance(body, dict) else None
        if (
            not isinstance(sequences, list)
            or not 1 <= len(sequences) <= MAX_SEQUENCES
            or not all(isinstance(s, list) and s and all(isinstance(t, int) for t in s) for s in sequences)
        ):
            return Response(f"input_ids: 1 to {MAX_SEQUENCES} non-empty lists of token ids", status_code=400)
        manager = http_server.get_global_state().tokenizer_manager
        try:
            results = await manager.generate_request(GenerateReqInput(**features_request(sequences)), request).__anext__()
            blob = features_blob(results, sequences)
        except FeaturesUnavailable as err:
            return Response(str(err), status_code=409)
        except ValueError as err:  # SGLang's request validation (a prompt too long, ...)
            return Response(str(err), status_code=400)
        return Response(blob, media_type="application/octet-stream")

    http_server.app.add_api_route(FEATURES_ROUTE, features, methods=["POST"])
