"""The trainer's job API over real gRPC and a real Redis, the trainer a real process (no rollout
server here: a started job waits for one, which is all these tests need)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlt.jobs.client import JobClient
from tlt.jobs.spec import JobSpec
from tlt.local.process import GrpcServiceProcess
from tlt.v1 import jobs_pb2 as pb

TOKEN = "job-test-token"


@pytest.fixture(scope="module")
def trainer(redis_server, tmp_path_factory) -> Iterator[GrpcServiceProcess]:
    root = tmp_path_factory.mktemp("trainer")
    env = {**redis_server.client_env(), "TLT_TRAINER_AUTH_TOKEN": TOKEN}
    with GrpcServiceProcess("trainer", root / "trainer.log", args=["--runs-dir", str(root / "runs")], env=env).start(120) as process:
        yield process


@pytest.fixture
def client(trainer) -> Iterator[JobClient]:
    with JobClient(trainer.target, TOKEN) as job_client:
        yield job_client


def _refused(fn, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        fn(*args)
    return caught.value


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (pb.JobSpec(name="bad name!"), "name"),
        (pb.JobSpec(name="g1", samples_per_prompt=1), "samples_per_prompt"),
        (pb.JobSpec(name="g2", grpo=pb.GrpoConfig(overlong="truncate")), "grpo.overlong"),
        (pb.JobSpec(name="g3", temperature=0.0), "temperature"),
        (pb.JobSpec(name="g4", model_path="/nonexistent/model"), "model_path"),
        (pb.JobSpec(name="g5", drafter_path="/nonexistent/drafter"), "drafter_path"),
        (pb.JobSpec(name="g6", task="jsonl", dataset_path="/nonexistent/math.jsonl"), "dataset_path"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(client: JobClient, spec: pb.JobSpec, field: str) -> None:
    err = _refused(client.submit, spec)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(f"{field}:") or f"; {field}:" in err.details(), err.details()


def test_a_wrong_or_missing_token_is_refused(trainer) -> None:
    for token in (None, "wrong"):
        with JobClient(trainer.target, token) as stranger:
            assert _refused(stranger.list).code() == grpc.StatusCode.UNAUTHENTICATED


def test_unknown_and_malformed_job_ids(client: JobClient) -> None:
    assert _refused(client.get, "no-such-job").code() == grpc.StatusCode.NOT_FOUND
    assert _refused(client.cancel, "no-such-job").code() == grpc.StatusCode.NOT_FOUND
    assert _refused(lambda: list(client.watch("no-such-job"))).code() == grpc.StatusCode.NOT_FOUND
    assert _refused(client.get, "../etc").code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _refused(client.list, "DONE").code() == grpc.StatusCode.INVALID_ARGUMENT


def _wait_state(client: JobClient, job_id: str, state: str, timeout_s: float = 60.0) -> pb.Job:
    deadline = time.monotonic() + timeout_s
    while (job := client.get(job_id)).state != state:
        assert time.monotonic() < deadline, f"{job_id} stayed {job.state}: {job.message}"
        time.sleep(0.1)
    return job


def test_submit_list_watch_and_cancel(client: JobClient, tmp_path: Path) -> None:
    first = client.submit(JobSpec(name="svc-first", steps=2, prompts_per_step=2, samples_per_prompt=2))
    assert first.state == "QUEUED" and first.spec.steps == 2 and first.spec.grpo.clip_high == pytest.approx(0.28)
    _wait_state(client, "svc-first", "RUNNING")  # it waits for a rollout server that never comes
    second = client.submit(JobSpec(name="svc-second", steps=1))
    assert second.state == "QUEUED"
    assert _refused(client.submit, JobSpec(name="svc-first")).code() == grpc.StatusCode.ALREADY_EXISTS

    listed = [j.job_id for j in client.list() if j.job_id.startswith("svc-")]
    assert listed == ["svc-second", "svc-first"]  # newest first
    assert [j.job_id for j in client.list("QUEUED") if j.job_id.startswith("svc-")] == ["svc-second"]
    assert len(client.list(limit=1)) == 1

    assert client.cancel("svc-second").state == "CANCELLED"  # queued: at once
    cancelled = client.cancel("svc-first")  # running: at its runner's next check
    assert cancelled.state in ("RUNNING", "CANCELLED")
    events = list(client.watch("svc-first"))  # ends with the job
    states = [e.state for e in events if e.state]
    assert states == ["QUEUED", "RUNNING", "CANCELLED"], events
    assert client.get("svc-first").finished_at > 0
    # A watch continued after the last event it saw gets nothing more (the job has ended).
    assert list(client.watch("svc-first", events[-1].event_id)) == []
    assert client.cancel("svc-first").state == "CANCELLED"  # idempotent


def _tlt(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tlt.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_the_cli_submits_lists_watches_and_cancels(trainer, tmp_path: Path) -> None:
    remote = ["--trainer", trainer.target, "--token", TOKEN]
    job = tmp_path / "job.yaml"
    job.write_text("name: cli-job\nsteps: 3\nprompts_per_step: 2\nsamples_per_prompt: 2\n")
    submitted = _tlt("submit", str(job), *remote)
    assert submitted.returncode == 0 and "cli-job: QUEUED" in submitted.stdout, submitted.stdout + submitted.stderr
    listed = _tlt("list", *remote)
    assert listed.returncode == 0 and "cli-job" in listed.stdout and "0/3" in listed.stdout, listed.stdout
    assert _tlt("cancel", "cli-job", *remote).returncode == 0
    watched = _tlt("watch", "cli-job", *remote)
    assert watched.returncode == 0 and "cli-job: CANCELLED (cancelled" in watched.stdout, watched.stdout
    unknown = _tlt("cancel", "no-such-job", *remote)
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stdout
    assert _tlt("list", "--trainer", trainer.target, "--token", "wrong").returncode == 1


ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED}
text = st.text(max_size=80)
number = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["SubmitJob", "GetJob", "ListJobs", "CancelJob", "WatchJob"]),
    name=text,
    other=text,
    count=number,
    real=st.floats(allow_nan=True, allow_infinity=True),
)
def test_fuzzed_requests_get_clear_errors_and_the_trainer_stays_up(trainer, client, method, name, other, count, real) -> None:
    fuzzed = {
        # model_path is fuzzed too, so no fuzzed job is ever accepted and run
        "SubmitJob": pb.JobSpec(
            name=name, model_path=other, steps=count, samples_per_prompt=count, temperature=real,
            grpo=pb.GrpoConfig(overlong=other, clip_high=real), task=other, seed=count,
        ),
        "GetJob": pb.JobRef(job_id=name),
        "ListJobs": pb.ListJobsRequest(state=other, limit=count),
        "CancelJob": pb.JobRef(job_id=name),
        "WatchJob": pb.WatchRequest(job_id=name, after_event_id=other),
    }  # fmt: skip
    try:
        answer = getattr(client.stub, method)(fuzzed[method], metadata=client._metadata, timeout=30)
        if method == "WatchJob":
            list(answer)
    except grpc.RpcError as err:
        assert err.code() in ALLOWED, (err.code(), err.details())
    assert trainer.alive()
