"""Random tiny HF checkpoints made by the tests (no model hub here)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tlt.models.tokenizer import build_char_tokenizer, save_tokenizer
from tlt.tasks import GcdTask


def make_random_checkpoint(arch: str, out: Path, seed: int = 0) -> Path:
    """A 2-layer random model of `arch` ("qwen2" or "llama") with the task's char tokenizer.

    A wide initialiser makes next-token distributions peaked, so that greedy decoding has no
    near-ties that float rounding could flip between engines.
    """
    tokenizer = build_char_tokenizer(GcdTask.ALPHABET)
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "initializer_range": 0.3,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
    }
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(arch)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, out)
    return out
