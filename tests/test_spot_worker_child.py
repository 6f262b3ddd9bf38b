"""`python -m rollout_server --spot-worker`: the spot worker as the server's own child (how a GPU pod
runs it, so that it trains on the server's GPU), trained from, restarted when killed, stopped with
the server. Real processes: Redis, the drafter service, the server and its worker."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import grpc
import pytest
import requests
from transformers import AutoTokenizer

from tests.processes import live_in_groups, poll, until
from tlt.local.process import GrpcServiceProcess, RolloutServerProcess
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.store.weight_channel import WeightChannel
from tlt.tasks import GcdTask
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc

pytestmark = pytest.mark.slow


def _workers_in(group: int) -> list[int]:
    return [pid for pid, _ in live_in_groups({group}, b"rollout_server.spot_worker")]


def _roll_out_until_a_commit(url: str, body: dict, channel: WeightChannel, batches: int = 4, wait_s: float = 120) -> None:
    """Send rollout batches, as a job does, until the worker commits v2: a measure on one batch's
    held-out samples may say "not yet", and the worker then waits for new samples."""
    for _ in range(batches):
        requests.post(f"{url}/generate", json=body, timeout=600).raise_for_status()
        if poll(lambda: (channel.latest_version() or 0) >= 2, wait_s):
            return
    raise AssertionError(f"no slice of the server's own worker committed after {batches} rollout batches")


def test_the_servers_own_spot_worker_trains_is_restarted_and_stops_with_it(redis_server, tmp_path: Path) -> None:
    job = f"child-{uuid.uuid4().hex[:6]}"
    env = redis_server.client_env()
    with GrpcServiceProcess("drafter_service", tmp_path / "service.log", env=env).start(timeout_s=60) as service:
        with grpc.insecure_channel(service.target) as channel:
            drafter_pb2_grpc.DrafterServiceStub(channel).RegisterDrafter(
                pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL))  # fresh: v1, much to learn
            )
        args = ["--spot-worker", "--speculative", "adaptive", "--draft-model-path", str(BUNDLED_DRAFTER), "--samples-job", job]
        server = RolloutServerProcess(BUNDLED_MODEL, tmp_path / "server.log", args=args, env=env)
        spot_env = {
            "TLT_SPOT_SERVER_URL": server.url, "TLT_SPOT_DRAFTER_SERVICE": service.target, "TLT_SPOT_JOB_ID": job,
            "TLT_SPOT_WORKER_ID": "pod-0", "TLT_SPOT_POLICY_PATH": str(BUNDLED_MODEL), "TLT_SPOT_IDLE_GRACE_S": "0.2",
            "TLT_SPOT_MIN_NEW_SAMPLES": "8", "TLT_SPOT_SAMPLES": "64", "TLT_SPOT_LR": "2e-3",  # a fresh drafter's rate
        }  # fmt: skip
        server.env = {**(server.env or {}), **spot_env}
        with server.start():
            group = server.process.pid
            (worker,) = until(lambda: _workers_in(group), 60, "the spot worker to start")
            tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
            prompts = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(32, seed=9, split="train")]
            body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 200, "temperature": 1.0}}
            channel = WeightChannel(redis_server.settings.client(), job, "drafter")
            _roll_out_until_a_commit(server.url, body, channel)

            os.kill(worker, signal.SIGKILL)
            (successor,) = until(lambda: [p for p in _workers_in(group) if p != worker], 30, "the spot worker's restart")
            assert successor != worker
        assert not _workers_in(group)  # stopped with its server
