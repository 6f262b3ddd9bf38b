"""Checks SGLang 0.5.23 misses on incoming prompts: an empty prompt or a token id outside the
vocabulary crashes its scheduler (and with it the server) instead of failing the one request."""

from __future__ import annotations

from collections.abc import Sequence


def check_prompt_ids(input_ids: Sequence[int] | None, vocab_size: int) -> None:
    """Raise ValueError (SGLang answers HTTP 400) for an empty prompt or out-of-vocabulary ids."""
    if input_ids is None:
        return  # embeddings-only input: nothing to check here
    if len(input_ids) == 0:
        raise ValueError("the prompt is empty (0 tokens)")
    bad = [i for i in input_ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"token ids out of the vocabulary [0, {vocab_size}): {bad[:5]}")
