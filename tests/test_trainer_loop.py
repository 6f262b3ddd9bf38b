"""The GRPO loop over real rollout servers (one speculating with the bundled drafter, one not): ten
seeded steps raise the accuracy of the sampled policy on held-out problems;
each step's samples come from the version the step started on, and every published version is
what the servers then serve (greedy outputs equal HF's on the trainer's own weights, with SD too)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch
from transformers import AutoTokenizer

from tlt.jobs.spec import JobSpec
from tlt.local.process import RolloutServerProcess, SidecarProcess
from tlt.models.hf_generate import greedy_generate
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.rollout.client import SamplingParams, server_load
from tlt.rollout.pool import RolloutPool
from tlt.store.weight_channel import WeightChannel
from tlt.tasks import GcdTask
from trainer.loop import GrpoTrainer
from trainer.policy_publisher import DiskPolicyPublisher, RedisPolicyPublisher, served_version
from trainer.version_barrier import VersionBarrier

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[list[RolloutServerProcess]]:
    logs = tmp_path_factory.mktemp("trainer-servers")
    speculating = ["--speculative", "adaptive", "--draft-model-path", str(BUNDLED_DRAFTER), "--random-seed", "0"]
    a = RolloutServerProcess(BUNDLED_MODEL, logs / "a.log", args=speculating)
    b = RolloutServerProcess(BUNDLED_MODEL, logs / "b.log", args=["--random-seed", "0"])
    with a.start(), b.start():
        yield [a, b]


def _trainer(servers, tmp_path: Path, **spec) -> GrpoTrainer:
    urls = [s.url for s in servers]
    job = JobSpec(name="loop-test", **spec)
    barrier = VersionBarrier(DiskPolicyPublisher(tmp_path / "policy"))
    trainer = GrpoTrainer(job, RolloutPool(lambda: urls, admit=barrier.admit), barrier, lambda: urls)
    trainer.publish()  # version 0: the servers may still hold another test's policy
    return trainer


def _held_out_prompts() -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    return [tokenizer(p.prompt).input_ids for p in GcdTask().sample(6, seed=99, split="test")]


def _greedy_reference(trainer: GrpoTrainer) -> list[list[int]]:
    """HF greedy outputs of the trainer's current weights on a few held-out prompts."""
    tokenizer = trainer.tokenizer
    trainer.policy.eval()
    with torch.no_grad():
        outputs = greedy_generate(trainer.policy, _held_out_prompts(), 120, tokenizer.eos_token_id, tokenizer.pad_token_id)
    trainer.policy.train()
    return [list(o) for o in outputs]


def _greedy_of(server: RolloutServerProcess) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=120, temperature=0.0)
    return [c.output_ids for c in server.client().generate_batch(_held_out_prompts(), params)]


def test_published_versions_are_what_the_servers_serve(servers, tmp_path: Path) -> None:
    trainer = _trainer(servers, tmp_path, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=256, lr=1e-3)
    first = trainer.step(0)
    second = trainer.step(1)
    print(f"steps: {first}\n{second}")
    assert first.policy_version == 0 and second.policy_version == 1 and trainer.version == 2
    assert first.stale_samples == 0 and second.stale_samples == 0 and second.samples == 32
    assert 1.0 < first.spec_accept_length <= 5.0  # server A speculated (4 draft steps) on its share
    assert first.clip_fraction == 0.0  # on-policy: the servers' logprobs are the trainer's own
    expected = _greedy_reference(trainer)
    for server in servers:
        assert _greedy_of(server) == expected, f"{server.url} does not serve the trainer's weights"




def test_a_server_that_joins_mid_job_serves_the_current_version_first(servers, tmp_path: Path) -> None:
    a, b = servers
    urls = [a.url]
    barrier = VersionBarrier(DiskPolicyPublisher(tmp_path / "policy"))
    job = JobSpec(name="join-test", prompts_per_step=8, samples_per_prompt=4, max_new_tokens=200, lr=1e-3)
    trainer = GrpoTrainer(job, RolloutPool(lambda: urls, admit=barrier.admit), barrier, lambda: urls)
    body = {"model_path": str(BUNDLED_MODEL), "weight_version": "another-job"}
    requests.post(f"{b.url}/update_weights_from_disk", json=body, timeout=60).raise_for_status()
    trainer.publish()
    trainer.step(0)  # publishes v1 to A only: B is not known yet
    assert served_version(b.url) == "another-job"
    urls.append(b.url)  # B joins (scaled up)
    joined = trainer.step(1)
    print(f"step 1 samples by server: {joined.samples_by_server}")
    assert joined.samples_by_server.get(b.url, 0) > 0 and joined.stale_samples == 0 and joined.policy_version == 1
    assert served_version(b.url) == served_version(a.url) == "2"


def test_ten_steps_raise_the_held_out_sampled_accuracy(servers, tmp_path: Path) -> None:
    trainer = _trainer(servers, tmp_path, prompts_per_step=32, samples_per_prompt=8, max_new_tokens=512, lr=1e-4)
    before = trainer.evaluate(256, temperature=1.0, samples=2)  # what GRPO optimises: the sampled policy
    rewards = [trainer.step(step).reward_mean for step in range(10)]
    after = trainer.evaluate(256, temperature=1.0, samples=2)
    print(f"held-out accuracy at T=1: {before:.3f} -> {after:.3f}; training reward per step: " + ", ".join(f"{r:.2f}" for r in rewards))
    assert after > before + 0.05  # 512 samples each: the standard error of either figure is about 0.022


def test_a_server_killed_mid_step_leaves_the_step_complete(servers, tmp_path: Path) -> None:
    """Kills server B mid-step (and starts it again for the tests after it)."""
    b = servers[1]
    trainer = _trainer(servers, tmp_path, prompts_per_step=16, samples_per_prompt=4, max_new_tokens=400, lr=1e-4)

    def kill_b_once_busy() -> None:
        deadline = time.monotonic() + 120
        while server_load(b.url) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # B has requests in flight
        b.kill()

    killer = threading.Thread(target=kill_b_once_busy)
    killer.start()
    metrics = trainer.step(0)
    killer.join()
    b.start()
    print(f"B killed mid-step: {metrics.resent} samples re-sent; samples by server {metrics.samples_by_server}")
    assert metrics.samples == 64 and sum(metrics.samples_by_server.values()) == 64  # every sample once
    assert metrics.resent > 0 and metrics.stale_samples == 0


def test_policy_versions_through_redis_reach_the_server_and_bad_ones_are_refused(servers, redis_server, tmp_path: Path) -> None:
    """The Redis policy channel: the trainer publishes to the job's channel, B's policy follower
    loads each version; a corrupted version is refused and B keeps serving the last good one."""
    b = servers[1]
    job = JobSpec(name=f"redis-policy-{uuid.uuid4().hex[:6]}", prompts_per_step=8, samples_per_prompt=4, max_new_tokens=200, lr=1e-3)
    channel = WeightChannel(redis_server.settings.client(), job.name, "policy")
    follower_args = ["--server-url", b.url, "--job-id", job.name, "--base-model-path", str(BUNDLED_MODEL), "--work-dir", str(tmp_path / "follower")]
    follower = SidecarProcess("rollout_server.policy_follower", tmp_path / "follower.log", follower_args, env=redis_server.client_env())
    with follower.start(60):
        barrier = VersionBarrier(RedisPolicyPublisher(channel, timeout_s=60))
        trainer = GrpoTrainer(job, RolloutPool(lambda: [b.url], admit=barrier.admit), barrier, lambda: [b.url])
        trainer.publish()
        metrics = trainer.step(0)  # publishes v1 through Redis
        assert metrics.stale_samples == 0 and served_version(b.url) == "1"
        assert _greedy_of(b) == _greedy_reference(trainer)

        # A version without the trainer's version number (not written by a trainer) is refused.
        channel.publish_blob(channel.read()[1], channel.latest_version(), {})
        time.sleep(3.0)  # the follower has seen the announcement by now
        assert served_version(b.url) == "1" and "rejected" in follower.log_tail()
