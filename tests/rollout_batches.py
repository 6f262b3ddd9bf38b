"""Batches of rollout requests the pool tests send."""

from __future__ import annotations

from transformers import AutoTokenizer

from tlt.paths import BUNDLED_MODEL
from tlt.rollout.client import SamplingParams
from tlt.rollout.pool import RolloutRequest
from tlt.tasks import GcdTask


def greedy_batch(n: int) -> list[RolloutRequest]:
    """`n` greedy samples of 160 tokens (EOS ignored), four per prompt group."""
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    params = SamplingParams(max_new_tokens=160, temperature=0.0, ignore_eos=True)
    problems = GcdTask().sample(n, seed=4, split="train")
    return [RolloutRequest(f"s{i}", i // 4, tuple(tokenizer(p.prompt).input_ids), params) for i, p in enumerate(problems)]
