"""The distributed policy channel against real rollout servers: the trainer and the servers in
one gloo group, versions broadcast in buckets through SGLang's weight-update API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tlt.local.process import RolloutServerProcess
from tlt.models.hf_generate import greedy_generate
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.rollout.client import model_info
from tlt.tasks import GcdTask
from trainer.version_barrier import VersionBarrier
from trainer.weight_broadcast import BroadcastPolicyPublisher

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[list[str]]:
    """A plain server and one speculating with the bundled drafter (only the target is updated)."""
    logs = tmp_path_factory.mktemp("broadcast")
    speculative = ["--speculative", "always", "--draft-steps", "3", "--draft-model-path", str(BUNDLED_DRAFTER)]
    with (
        RolloutServerProcess(BUNDLED_MODEL, logs / "plain.log", args=["--random-seed", "0"]) as plain,
        RolloutServerProcess(BUNDLED_MODEL, logs / "speculative.log", args=["--random-seed", "0", *speculative]) as spec,
    ):
        yield [plain.url, spec.url]


def _perturbed_policy(seed: int):
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model


def _greedy(url: str, prompts: list[list[int]]) -> list[list[int]]:
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 60, "temperature": 0}}
    answer = requests.post(f"{url}/generate", json=body, timeout=300)
    answer.raise_for_status()
    return [r["output_ids"] for r in answer.json()]


def test_broadcast_versions_serve_the_trainers_weights(servers: list[str]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    prompts = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(6, seed=11, split="test")]
    publisher = BroadcastPolicyPublisher(bucket_bytes=256 * 1024)  # several buckets for a 3 MB policy
    barrier = VersionBarrier(publisher)
    try:
        for version, seed in ((1, 1), (2, 2)):  # the second reuses the group
            policy = _perturbed_policy(seed)
            location = publisher.write(policy, tokenizer, version)
            assert barrier.publish(servers, location, version) == []
            reference = [list(o) for o in greedy_generate(policy, prompts, 60, tokenizer.eos_token_id, tokenizer.pad_token_id)]
            for url in servers:
                assert model_info(url)["weight_version"] == str(version)
                assert _greedy(url, prompts) == reference, url
        # A server admitted alone (as after a restart) gets a group of its own.
        publisher.load_into(servers[:1], location, 2)
        assert _greedy(servers[0], prompts) == reference
    finally:
        publisher.close()
