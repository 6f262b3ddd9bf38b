"""Drafter hot-swap in a real rollout server fed by a real Redis: new versions go in between
batches and raise the accept length, bad ones are rejected while the old drafter keeps serving,
and greedy outputs stay identical to HF throughout."""

from __future__ import annotations

import hashlib
import time
import uuid

import pytest
import requests
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.greedy_speculation import tokens_per_verification
from tests.metrics import metric_value
from tlt.local.process import RolloutServerProcess
from tlt.models.hf_generate import greedy_generate
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.store import weight_channel
from tlt.store.samples_stream import SamplesStream
from tlt.store.weight_channel import WeightChannel
from tlt.tasks import GcdTask

pytestmark = pytest.mark.slow


def _metric(server: RolloutServerProcess, name: str) -> float:
    return metric_value(server.url, name)


def _wait_for(server: RolloutServerProcess, name: str, value: float, timeout_s: float = 60.0) -> None:
    """Swaps happen between batches: keep a trickle of requests going until the metric shows."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        requests.post(f"{server.url}/generate", json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}, timeout=60)
        if _metric(server, name) == value:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never reached {value} (now {_metric(server, name)})")


def test_drafter_versions_swap_in_and_bad_ones_are_refused(redis_server, tmp_path, monkeypatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    prompts = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(8, seed=11, split="test")]
    reference = [list(o) for o in greedy_generate(model, prompts, 120, tokenizer.eos_token_id, tokenizer.pad_token_id)]
    good = load_file(BUNDLED_DRAFTER / "model.safetensors")
    useless = {name: torch.zeros_like(t) for name, t in good.items()}

    job = f"swap-{uuid.uuid4().hex[:6]}"
    channel = WeightChannel(redis_server.settings.client(), job, "drafter")
    v1 = channel.publish(useless, parent=None)
    env = redis_server.client_env()
    args = ["--speculative", "always", "--draft-steps", "3", "--draft-model-path", str(BUNDLED_DRAFTER)]
    args += ["--drafter-job", job, "--samples-job", job, "--enable-metrics", "--random-seed", "0"]
    with RolloutServerProcess(BUNDLED_MODEL, tmp_path / "server.log", args=args, env=env) as server:
        _wait_for(server, "tlt_drafter_version", v1.version)
        useless_accept = tokens_per_verification(server, prompts, reference, 120)

        # A blob that does not fit the draft model, one whose tensors SGLang's loader would skip
        # (misnamed: it would change nothing), then one whose hash is wrong: all refused.
        misfit = channel.publish({**useless, "fc.weight": torch.zeros(3, 3)}, parent=v1.version)
        misnamed = channel.publish({f"model.{name}": t for name, t in good.items()}, parent=misfit.version)
        real_sha256 = hashlib.sha256
        with monkeypatch.context() as patch:  # the writer records the hash of other bytes
            patch.setattr(weight_channel.hashlib, "sha256", lambda data: real_sha256(data + b"!"))
            bad_hash = channel.publish(useless, parent=misnamed.version)
        _wait_for(server, "tlt_drafter_rejected_total", 3)
        assert _metric(server, "tlt_drafter_version") == v1.version
        assert tokens_per_verification(server, prompts, reference, 120) == pytest.approx(useless_accept)

        trained = channel.publish(good, parent=bad_hash.version)
        _wait_for(server, "tlt_drafter_version", trained.version)
        trained_accept = tokens_per_verification(server, prompts, reference, 120)
    # Every finished sequence went to the samples stream, token for token.
    samples = [record for _, record in SamplesStream(redis_server.settings.client(), job).read(count=10_000)]
    recorded = {(tuple(r.prompt_ids), tuple(r.output_ids)) for r in samples}
    assert {(tuple(p), tuple(o)) for p, o in zip(prompts, reference)} <= recorded
    print(f"tokens per verification: zeroed drafter {useless_accept:.2f}, trained drafter {trained_accept:.2f}")
    assert useless_accept < 1.5 and trained_accept > 2.5
