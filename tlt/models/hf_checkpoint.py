"""HF safetensors checkpoints: where each tensor is, and writing them in the dtype their readers
serve them in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import PreTrainedModel


def save_in_dtype(
    model: PreTrainedModel, out: Path, dtype: torch.dtype, weights: dict[str, torch.Tensor] | None = None, **kwargs: Any
) -> None:
    """`save_pretrained` with the weights cast to `dtype` and the config saying so (the model itself
    is left as it is: training keeps its float32 master weights). SGLang's `--dtype auto` reads the
    config's dtype, and maps float32 to float16: a GPU server must be handed bf16 explicitly.
    `weights`: the full weights when `model` holds only a shard of them (FSDP)."""
    weights = model.state_dict() if weights is None else weights
    state = {name: tensor.detach().to(dtype) for name, tensor in weights.items()}
    model.save_pretrained(out, state_dict=state, safe_serialization=True, **kwargs)
    config_path = Path(out) / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def tensor_files(checkpoint: Path) -> dict[str, str]:
    """Tensor name -> the file holding it, for a single-file or a sharded safetensors checkpoint
    (reads the index or the file's header, no tensor)."""
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    with safe_open(checkpoint / "model.safetensors", framework="pt") as weights:
        return dict.fromkeys(weights.keys(), "model.safetensors")
