"""The spot worker with a real rollout server, drafter service and Redis: an idle-time slice
trains a fresh drafter on the job's samples (features from the server's hidden states) and commits
a better version; slices preempted again and again still add up to a commit; a request arriving
at the server preempts a slice within one training micro-step and the lease is given back, also
while the worker holds the server paused (memory hand-off); a worker killed during a hand-off
leaves a note its successor undoes."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import grpc
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_server.memory_handoff import HandOffMarker, MemoryHandOff, recover_hand_off
from rollout_server.server_features import ServerFeatures
from rollout_server.spot_worker import SpotWorker, SpotWorkerConfig, served_model_path
from tlt.drafter.training import DrafterTrainingConfig, policy_features
from tlt.local.process import GrpcServiceProcess, RolloutServerProcess
from tlt.paths import BUNDLED_MODEL
from tlt.rollout.client import server_load
from tlt.store.samples_stream import SamplesStream
from tlt.store.spot_progress import SpotProgressBoard
from tlt.store.weight_channel import WeightChannel
from tlt.tasks import GcdTask
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc

pytestmark = pytest.mark.slow
JOB = f"spot-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def setup(redis_server, tmp_path_factory) -> Iterator[tuple[RolloutServerProcess, SpotWorker]]:
    env = redis_server.client_env()
    logs = tmp_path_factory.mktemp("spot")
    service = GrpcServiceProcess("drafter_service", logs / "service.log", env=env).start(timeout_s=60)
    server = RolloutServerProcess(BUNDLED_MODEL, logs / "server.log", args=["--samples-job", JOB, "--random-seed", "0"], env=env)
    with service, server.start(), grpc.insecure_channel(service.target) as channel:
        stub = drafter_pb2_grpc.DrafterServiceStub(channel)
        stub.RegisterDrafter(pb.RegisterDrafterRequest(job_id=JOB, policy_path=str(BUNDLED_MODEL)))  # fresh: v1
        tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
        prompts = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(96, seed=5, split="train")]
        payload = {"input_ids": prompts * 2, "sampling_params": {"max_new_tokens": 300, "temperature": 1.0}}
        requests.post(f"{server.url}/generate", json=payload, timeout=600).raise_for_status()
        client = redis_server.settings.client()
        config = SpotWorkerConfig(
            job_id=JOB,
            worker_id="pod-0",
            policy_path=str(BUNDLED_MODEL),
            training=DrafterTrainingConfig(epochs=6, tokens_per_row=512, rows_per_step=2, lr=3e-3),
        )
        worker = SpotWorker(
            config,
            WeightChannel(client, JOB, "drafter"),
            SamplesStream(client, JOB),
            stub,
            lambda: server_load(server.url) > 0,
            features=ServerFeatures(server.url).many,
        )
        yield server, worker


def test_finished_rollouts_reach_the_samples_stream(setup, redis_server) -> None:
    assert len(SamplesStream(redis_server.settings.client(), JOB)) == 192


def test_server_features_are_the_policys_and_are_not_samples(setup, redis_server) -> None:
    _, worker = setup
    stream = SamplesStream(redis_server.settings.client(), JOB)
    before = len(stream)
    sequences = [r.prompt_ids + r.output_ids for r in stream.latest(5)]
    policy = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    for token_ids, features in zip(sequences, worker.features(sequences), strict=True):  # one batched prefill, binary
        torch.testing.assert_close(features, policy_features(policy, token_ids), atol=1e-4, rtol=1e-4)
    assert len(stream) == before
    assert not hasattr(worker, "policy")  # with server features the worker holds only the borrowed parts
    bad = requests.post(f"{setup[0].url}/tlt/features", json={"input_ids": [[]]}, timeout=30)
    assert bad.status_code == 400


def test_an_idle_slice_commits_a_better_drafter(setup) -> None:
    server, worker = setup
    assert server_load(server.url) == 0
    result = worker.run_slice()
    print(f"slice: v{result.base_version} -> v{result.version}, accept length {result.accept_length_before:.2f} -> {result.accept_length:.2f}")
    assert not result.preempted and result.version == result.base_version + 1
    assert result.accept_length > result.accept_length_before + 0.3
    info = worker.stub.GetDrafter(pb.DrafterRef(job_id=JOB))
    assert info.latest_version == result.version and info.active_lease_id == ""
    assert info.history[-1].accept_length == pytest.approx(result.accept_length)
    progress = SpotProgressBoard(worker.samples.client, JOB).read()
    assert [(p.worker_id, p.state, p.base_version, p.steps, p.committed) for p in progress] == [("pod-0", "idle", result.version, 0, 1)]


def test_a_slice_preempted_several_times_still_commits(setup) -> None:
    """What a preempted slice did is kept: slices cut short every ninth unit of work (a training
    step, a held-out sequence, a batch of features) add up to a committed version."""
    server, worker = setup
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    prompts = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(96, seed=6, split="train")]
    payload = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 300, "temperature": 1.0}}
    requests.post(f"{server.url}/generate", json=payload, timeout=600).raise_for_status()  # new samples
    busy, checks = worker.busy, itertools.count(1)
    worker.busy = lambda: next(checks) % 9 == 0 or busy()
    results = []
    try:
        while not results or results[-1].preempted:
            assert len(results) < 300, "never committed"
            results.append(worker.run_slice())
    finally:
        worker.busy = busy
    committed = results[-1]
    preempted = [r for r in results if r.preempted]
    print(f"{len(preempted)} preempted slices ({sum(r.steps for r in preempted)} steps), then v{committed.version}: "
          f"{committed.accept_length_before:.3f} -> {committed.accept_length:.3f} +- {committed.gain_standard_error:.3f}")
    assert len(preempted) >= 3 and sum(r.steps for r in preempted) > 0
    assert committed.version == committed.base_version + 1
    assert committed.accept_length > committed.accept_length_before + 2 * committed.gain_standard_error
    assert worker.stub.GetDrafter(pb.DrafterRef(job_id=JOB)).active_lease_id == ""


def test_a_request_preempts_the_slice_within_a_micro_step(setup) -> None:
    server, worker = setup
    steps_seen = threading.Event()
    busy = worker.busy
    checks = [0]

    def counting_busy() -> bool:
        checks[0] += 1
        if checks[0] > 3:
            steps_seen.set()
        return busy()

    worker.busy = counting_busy
    outcome = {}
    slice_thread = threading.Thread(target=lambda: outcome.setdefault("result", worker.run_slice()))
    slice_thread.start()
    assert steps_seen.wait(120), "the slice never started checking"
    sent = time.monotonic()
    load = threading.Thread(
        target=lambda: requests.post(
            f"{server.url}/generate",
            json={"input_ids": [[5, 6, 0, 3, 6, 11]], "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}},
            timeout=120,
        )
    )
    load.start()
    slice_thread.join(120)
    stopped = time.monotonic()
    load.join()
    worker.busy = busy
    result = outcome["result"]
    print(f"preempted {stopped - sent:.3f} s after the request was sent ({result.preempt_latency_s:.3f} s after busy was seen)")
    assert result.preempted and result.version is None
    assert worker.stub.GetDrafter(pb.DrafterRef(job_id=JOB)).active_lease_id == ""


def test_requests_held_by_a_paused_server_preempt_the_slice(setup) -> None:
    server, worker = setup
    training = threading.Event()

    @contextmanager
    def paused():
        # release=False: SGLang's KV-cache release needs CUDA; the pause and the preemption path are the same.
        with MemoryHandOff(server.url, release=False):
            training.set()
            yield

    worker.hand_off = paused
    outcome: dict = {}
    slice_thread = threading.Thread(target=lambda: outcome.setdefault("result", worker.run_slice()))
    slice_thread.start()
    try:
        assert training.wait(120), "the slice never reached training"
        payload = {"input_ids": [5, 6, 0, 3, 6, 11], "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}}
        answer = requests.post(f"{server.url}/generate", json=payload, timeout=120)
        slice_thread.join(120)
    finally:
        worker.hand_off = nullcontext
    assert answer.status_code == 200 and len(answer.json()["output_ids"]) == 50
    result = outcome["result"]
    print(f"paused slice preempted {result.preempt_latency_s:.3f} s after the held request was seen")
    assert result.preempted and result.version is None
    assert server_load(server.url) == 0


def test_the_worker_follows_the_policy_the_server_serves(setup, tmp_path) -> None:
    """After the trainer publishes a policy version, the drafter's shared embedding and head are
    the new policy's, not the initial one's. Restores the bundled policy on the server afterwards."""
    from transformers import AutoModelForCausalLM

    server, worker = setup
    policy = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    with torch.no_grad():
        policy.get_input_embeddings().weight.mul_(1.5)
    published = tmp_path / "policy-v1"
    policy.save_pretrained(published)
    AutoTokenizer.from_pretrained(BUNDLED_MODEL).save_pretrained(published)
    worker.policy_source = lambda: served_model_path(server.url)
    try:
        body = {"model_path": str(published), "weight_version": "1"}
        requests.post(f"{server.url}/update_weights_from_disk", json=body, timeout=60).raise_for_status()
        worker._follow_policy()
        assert worker.policy_path == str(published)
        assert torch.equal(worker.parts.embed_tokens.weight, policy.get_input_embeddings().weight)
    finally:
        worker.policy_source = None
        body = {"model_path": str(BUNDLED_MODEL), "weight_version": "0"}
        requests.post(f"{server.url}/update_weights_from_disk", json=body, timeout=60).raise_for_status()


def test_a_worker_killed_while_its_server_is_paused_is_undone_by_its_successor(setup, redis_server) -> None:
    server, _ = setup
    marker_args = (JOB, "pod-killed")
    holder = subprocess.Popen(  # a worker inside a hand-off, killed -9 there
        [sys.executable, "-c", (
            "import sys, time; from rollout_server.memory_handoff import HandOffMarker, MemoryHandOff; "
            "from tlt.store.connection import RedisSettings; "
            f"MemoryHandOff({server.url!r}, release=False, marker=HandOffMarker(RedisSettings().client(), *{marker_args!r})).__enter__(); "
            "print('paused', flush=True); time.sleep(600)"
        )],
        stdout=subprocess.PIPE, env={**os.environ, **redis_server.client_env()},
    )  # fmt: skip
    assert holder.stdout.readline().strip() == b"paused"
    holder.kill()
    holder.wait()
    payload = {"input_ids": [5, 6, 0, 3, 6, 11], "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    with pytest.raises(requests.Timeout):  # left paused: the request waits
        requests.post(f"{server.url}/generate", json=payload, timeout=3)
    marker = HandOffMarker(redis_server.settings.client(), *marker_args)
    assert recover_hand_off(server.url, marker) == "paused"
    answer = requests.post(f"{server.url}/generate", json=payload, timeout=60)
    assert answer.status_code == 200 and len(answer.json()["output_ids"]) == 8
    assert marker.get() is None and recover_hand_off(server.url, marker) is None


LOWER_PRIORITY = """
import os, threading
from pathlib import Path
from rollout_server.spot_worker import lower_priority
started = threading.Event()
threading.Thread(target=lambda: (started.set(), threading.Event().wait()), daemon=True).start()
started.wait()
lower_priority(int(os.environ["NICE"]))
print(sorted({os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in Path("/proc/self/task").iterdir()}))
"""


@pytest.mark.parametrize("nice", [0, 19])
def test_lower_priority_reaches_threads_started_before_it(nice: int) -> None:
    """Linux nice is per thread: a worker niced only on its main thread would train at full priority."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    out = subprocess.run([sys.executable, "-c", LOWER_PRIORITY], env={**os.environ, "NICE": str(nice)}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([max(base, nice)])
