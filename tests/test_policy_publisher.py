"""Published policy versions are written in the servers' dtype (bf16 on GPUs), config included."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tlt.paths import BUNDLED_MODEL
from trainer.policy_publisher import DiskPolicyPublisher


def test_a_gpu_run_publishes_bf16_weights_and_config_and_keeps_training_in_fp32(tmp_path: Path) -> None:
    policy = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    location = Path(DiskPolicyPublisher(tmp_path, dtype=torch.bfloat16).write(policy, tokenizer, 3))
    assert json.loads((location / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(location / "model.safetensors").values()} == {torch.bfloat16}
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # the master weights stay fp32
    loaded = AutoModelForCausalLM.from_pretrained(location)
    assert loaded.dtype == torch.bfloat16
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, policy.state_dict()[name].to(torch.bfloat16)), name


def test_a_cpu_run_publishes_float32(tmp_path: Path) -> None:
    policy = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    location = Path(DiskPolicyPublisher(tmp_path).write(policy, AutoTokenizer.from_pretrained(BUNDLED_MODEL), 0))
    assert json.loads((location / "config.json").read_text())["dtype"] == "float32"
