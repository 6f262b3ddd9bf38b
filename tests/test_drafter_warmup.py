"""The drafter service's offline Warmup with a real service process and Redis: a fresh drafter
warmed up on a text dataset commits a better version with progress streamed; a warm-up from the
job's samples stream can be cancelled (lease given back, nothing committed); bad datasets and
paths outside the data directory are refused naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tlt.local.process import GrpcServiceProcess
from tlt.paths import BUNDLED_MODEL
from tlt.store.samples_stream import SampleRecord, SamplesStream
from tlt.tasks import GcdTask
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("warmup-data")
    # The tiny policy was pretrained on these reference traces: they are close to its own outputs.
    problems = GcdTask().sample(160, seed=11, split="train")
    lines = [json.dumps({"prompt": p.prompt, "response": p.solution()}) for p in problems]
    (root / "gcd.jsonl").write_text("\n".join(lines) + "\n")
    (root / "bad.jsonl").write_text(lines[0] + "\n{\"prompt\": 3}\n")
    (root / "vocab.jsonl").write_text(json.dumps({"prompt_ids": [1, 2], "output_ids": [3, 99999]}) + "\n")
    return root


@pytest.fixture(scope="module")
def service(redis_server, data_dir, tmp_path_factory) -> Iterator[GrpcServiceProcess]:
    env = redis_server.client_env()
    log = tmp_path_factory.mktemp("warmup-service") / "service.log"
    args = ["--data-dir", str(data_dir), "--lease-ttl-s", "2"]  # a short lease: the warm-up must keep renewing it
    with GrpcServiceProcess("drafter_service", log, args=args, env=env).start(timeout_s=60) as process:
        yield process


@pytest.fixture(scope="module")
def stub(service) -> Iterator[drafter_pb2_grpc.DrafterServiceStub]:
    with grpc.insecure_channel(service.target) as channel:
        yield drafter_pb2_grpc.DrafterServiceStub(channel)


def _fresh_job(stub) -> str:
    job = f"warm-{uuid.uuid4().hex[:8]}"
    stub.RegisterDrafter(pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL)))
    return job


def test_warmup_on_a_dataset_commits_a_better_drafter(stub) -> None:
    job = _fresh_job(stub)
    events = list(stub.Warmup(pb.WarmupRequest(job_id=job, dataset_path="gcd.jsonl", epochs=20), timeout=600))
    phases = [e.phase for e in events]
    assert phases[0] == "features" and "training" in phases and phases[-1] == "done"
    training = [e for e in events if e.phase == "training"]
    assert [e.step for e in training] == sorted(e.step for e in training) and training[-1].step == training[-1].total
    done = events[-1]
    print(f"warm-up: accept length {done.accept_length_before:.2f} -> {done.accept_length:.2f}, v{done.version}, {len(events)} events")
    assert done.version == 2 and done.accept_length > done.accept_length_before + 0.5
    info = stub.GetDrafter(pb.DrafterRef(job_id=job))
    assert info.latest_version == 2 and info.active_lease_id == ""
    assert info.history[-1].committed_by == "warmup" and info.history[-1].accept_length == pytest.approx(done.accept_length)


def test_a_cancelled_warmup_gives_its_lease_back(stub, redis_server) -> None:
    job = _fresh_job(stub)
    problems = GcdTask().sample(64, seed=3, split="train")
    SamplesStream(redis_server.settings.client(), job).add_many(
        [SampleRecord(prompt_ids=[1, 2, 3], output_ids=[4 + i % 10 for i in range(p.a + 20)]) for p in problems]
    )
    call = stub.Warmup(pb.WarmupRequest(job_id=job, epochs=1000), timeout=600)
    for event in call:
        if event.phase == "training":
            assert stub.GetDrafter(pb.DrafterRef(job_id=job)).active_lease_id != ""
            call.cancel()
            break
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    assert info.value.code() == grpc.StatusCode.CANCELLED
    deadline = time.monotonic() + 10  # the training thread stops at its next step
    while stub.GetDrafter(pb.DrafterRef(job_id=job)).active_lease_id and time.monotonic() < deadline:
        time.sleep(0.1)
    info = stub.GetDrafter(pb.DrafterRef(job_id=job))
    assert info.active_lease_id == "" and info.latest_version == 1
    stub.Lease(pb.LeaseRequest(job_id=job, worker_id="pod-a"))  # the drafter can be leased again


@pytest.mark.parametrize(
    "path, code, words",
    [
        ("../outside.jsonl", grpc.StatusCode.INVALID_ARGUMENT, "outside the service's data directory"),
        ("/etc/passwd", grpc.StatusCode.INVALID_ARGUMENT, "outside the service's data directory"),
        ("missing.jsonl", grpc.StatusCode.INVALID_ARGUMENT, "no file"),
        ("bad.jsonl", grpc.StatusCode.INVALID_ARGUMENT, "line 2"),
        ("vocab.jsonl", grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
    ],
)
def test_bad_datasets_are_refused_naming_the_problem(stub, path: str, code: grpc.StatusCode, words: str) -> None:
    job = _fresh_job(stub)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Warmup(pb.WarmupRequest(job_id=job, dataset_path=path), timeout=120))
    assert info.value.code() == code and words in info.value.details()
    assert stub.GetDrafter(pb.DrafterRef(job_id=job)).active_lease_id == ""


def test_warmup_needs_a_free_drafter_and_samples(stub) -> None:
    job = _fresh_job(stub)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Warmup(pb.WarmupRequest(job_id=job), timeout=120))  # empty samples stream
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "usable sequences" in info.value.details()
    stub.Lease(pb.LeaseRequest(job_id=job, worker_id="pod-a"))
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Warmup(pb.WarmupRequest(job_id=job, dataset_path="gcd.jsonl"), timeout=120))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "leased" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Warmup(pb.WarmupRequest(job_id="nobody"), timeout=120))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_cli_warms_up_with_progress_and_reports_refusals(service, stub) -> None:
    job = _fresh_job(stub)
    base = [sys.executable, "-m", "tlt.cli", "drafter", "warmup", "--service", service.target, "--job", job]
    done = subprocess.run([*base, "--dataset", "gcd.jsonl", "--epochs", "8"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "training" in done.stdout and "committed as v2" in done.stdout
    refused = subprocess.run([*base, "--dataset", "../x.jsonl"], capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 1 and "INVALID_ARGUMENT" in refused.stdout and "outside" in refused.stdout
