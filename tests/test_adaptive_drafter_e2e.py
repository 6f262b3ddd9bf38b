"""The adaptive drafter end to end on one machine, every part its own process: Redis, the drafter
service, two rollout servers with speculation, and a spot worker beside each server.

Server A gets a long-tail batch, server B a short one. B goes idle first; its spot worker leases
a slice, trains the job's drafter (registered fresh: it accepts almost nothing) on the samples
both servers streamed, and commits version 2 while A is still decoding. Both servers swap it in
between two batches; tokens per verification rise on both, and greedy outputs stay identical to
HF transformers before and after.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.greedy_speculation import tokens_per_verification
from tests.metrics import metric_value
from tlt.local.process import GrpcServiceProcess, RolloutServerProcess, SpotWorkerProcess
from tlt.models.hf_generate import greedy_generate
from tlt.paths import BUNDLED_MODEL
from tlt.rollout.client import server_load
from tlt.tasks import GcdTask
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc

pytestmark = pytest.mark.slow


def _export(stub, job: str, out: Path) -> Path:
    out.mkdir(parents=True)
    for chunk in stub.ExportDrafter(pb.ExportRequest(job_id=job)):
        with (out / chunk.path).open("ab") as f:
            f.write(chunk.data)
    return out


def _drafter_version(server: RolloutServerProcess) -> float:
    return metric_value(server.url, "tlt_drafter_version")


def test_idle_server_trains_the_drafter_while_the_other_finishes(redis_server, tmp_path: Path) -> None:
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    env = redis_server.client_env()
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    held_out = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(12, seed=21, split="test")]
    reference = [list(o) for o in greedy_generate(model, held_out, 150, tokenizer.eos_token_id, tokenizer.pad_token_id)]
    train_prompts = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(160, seed=22, split="train")]

    with GrpcServiceProcess("drafter_service", tmp_path / "service.log", env=env).start(60) as service, grpc.insecure_channel(
        service.target
    ) as channel:
        stub = drafter_pb2_grpc.DrafterServiceStub(channel)
        stub.RegisterDrafter(pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL)))
        drafter_v1 = _export(stub, job, tmp_path / "drafter-v1")
        args = ["--speculative", "always", "--draft-steps", "3", "--draft-model-path", str(drafter_v1)]
        args += ["--drafter-job", job, "--samples-job", job, "--enable-metrics", "--random-seed", "0"]
        servers = [RolloutServerProcess(BUNDLED_MODEL, tmp_path / f"server-{n}.log", args=args, env=env) for n in "AB"]
        with servers[0], servers[1]:
            a, b = servers
            before = [tokens_per_verification(s, held_out, reference, 150) for s in servers]
            workers = [
                SpotWorkerProcess(
                    tmp_path / f"worker-{n}.log",
                    args=[
                        "--server-url", s.url, "--drafter-service", service.target, "--job-id", job,
                        "--worker-id", f"pod-{n}", "--policy-path", str(BUNDLED_MODEL), "--epochs", "8", "--lr", "2e-3",
                        "--min-new-samples", "100", "--idle-grace-s", "0.5",
                    ],
                    env=env,
                )
                for n, s in zip("AB", servers)
            ]  # fmt: skip
            with workers[0].start(30), workers[1].start(30):
                long_tail = {"input_ids": train_prompts[:12], "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
                short = {"input_ids": train_prompts[12:], "sampling_params": {"max_new_tokens": 120, "temperature": 1.0}}
                a_batch = threading.Thread(target=lambda: requests.post(f"{a.url}/generate", json=long_tail, timeout=900))
                started = time.monotonic()
                a_batch.start()
                requests.post(f"{b.url}/generate", json=short, timeout=600).raise_for_status()
                b_done = time.monotonic() - started
                deadline = time.monotonic() + 600
                while stub.GetDrafter(pb.DrafterRef(job_id=job)).latest_version < 2:
                    assert time.monotonic() < deadline, "no slice was committed"
                    time.sleep(0.25)
                committed = time.monotonic() - started
                a_still_busy = a_batch.is_alive() and server_load(a.url) > 0
                a_batch.join()
                a_done = time.monotonic() - started
            info = stub.GetDrafter(pb.DrafterRef(job_id=job))
            # The swap happens before a server's next batch: the evaluation batch is one.
            after = [tokens_per_verification(s, held_out, reference, 150) for s in servers]
            versions = [_drafter_version(s) for s in servers]
    print(
        f"B idle at {b_done:.1f} s; v2 committed by {info.history[1].committed_by} at {committed:.1f} s "
        f"(A busy then: {a_still_busy}); A done at {a_done:.1f} s; tokens/verification "
        f"A {before[0]:.2f} -> {after[0]:.2f}, B {before[1]:.2f} -> {after[1]:.2f}; "
        f"held-out accept length of v2 by its worker {info.history[1].accept_length:.2f}; "
        f"latest version {info.latest_version}"
    )
    assert info.history[1].committed_by == "pod-B" and a_still_busy
    assert all(v >= 2 for v in versions)
    assert all(x > y + 0.3 for x, y in zip(after, before))
