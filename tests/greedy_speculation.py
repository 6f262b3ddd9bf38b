"""A greedy batch on a speculating rollout server, checked against HF's outputs, measured as tokens
per verification step (the tests of drafter versions share it)."""

from __future__ import annotations

import requests

from tlt.local.process import RolloutServerProcess


def tokens_per_verification(server: RolloutServerProcess, prompts: list[list[int]], reference: list[list[int]], max_new_tokens: int) -> float:
    """Generate greedily; assert the outputs equal `reference`; return tokens per verification."""
    results = requests.post(
        f"{server.url}/generate",
        json={"input_ids": prompts, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}},
        timeout=600,
    ).json()
    assert [r["output_ids"] for r in results] == reference, "greedy output differs from HF"
    return sum(len(r["output_ids"]) for r in results) / sum(r["meta_info"]["spec_verify_ct"] for r in results)
