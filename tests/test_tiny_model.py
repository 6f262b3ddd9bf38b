"""The tiny reasoning model: deterministic pretraining, HF round trip, and the bundled checkpoint's
accuracy and long tail."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tlt.models.tiny import TinyModelSpec, pretrain, save_model
from tlt.rollout.evaluation import evaluate_with_hf


def _digest(path: Path) -> str:
    tensors = load_file(path / "model.safetensors")
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode() + tensors[name].numpy().tobytes())
    return h.hexdigest()


def test_pretraining_is_deterministic_and_saves_an_hf_checkpoint(tmp_path: Path) -> None:
    spec = TinyModelSpec(steps=3, hidden_size=32, num_layers=1, intermediate_size=64, batch_tokens=1024)
    losses: list[float] = []
    for run in ("a", "b"):
        model, tokenizer = pretrain(spec, lambda step, loss: losses.append(loss))
        save_model(model, tokenizer, spec, tmp_path / run)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert losses[:3] == losses[3:]
    other, tokenizer = pretrain(spec.model_copy(update={"seed": 1}))
    save_model(other, tokenizer, spec, tmp_path / "c")
    assert _digest(tmp_path / "c") != _digest(tmp_path / "a")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32)
    assert reloaded.config.tie_word_embeddings is False
    assert TinyModelSpec.of_checkpoint(tmp_path / "a") == spec


@pytest.mark.slow
def test_bundled_model_leaves_room_for_rl_and_shows_the_long_tail(tiny_model: Path) -> None:
    spec = TinyModelSpec.of_checkpoint(tiny_model)
    problems = spec.task().sample(300, seed=1, split="test")
    summary, _ = evaluate_with_hf(tiny_model, problems, max_new_tokens=1000)
    assert 0.2 <= summary.accuracy <= 0.7, summary
    assert summary.p99 >= 4 * summary.p50, summary
