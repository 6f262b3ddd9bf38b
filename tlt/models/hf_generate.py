"""Reference generation with HF transformers (the parity baseline for the rollout server)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel


@torch.inference_mode()
def greedy_generate(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int = 32,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Greedy continuations of token-id prompts, batched with left padding; each stops after its
    first `eos_token_id` (which is kept, as SGLang reports it in `output_ids`)."""
    outputs: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, prompt in enumerate(chunk):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
        )
        for row in generated[:, width:].tolist():
            outputs.append(_cut_after_eos(row, eos_token_id))
        if on_batch is not None:
            on_batch(len(chunk))
    return outputs


def _cut_after_eos(tokens: list[int], eos_token_id: int) -> list[int]:
    return tokens[: tokens.index(eos_token_id) + 1] if eos_token_id in tokens else tokens
