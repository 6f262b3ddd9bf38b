"""The trainer as a process over a real rollout server and Redis: a job runs to the end through the
job API; killed mid-job (SIGKILL), a restarted trainer resumes it at the step after its last
checkpoint; a cancelled job frees the rollout server at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tlt.jobs.client import JobClient
from tlt.jobs.records import JobEvent
from tlt.jobs.spec import JobSpec
from tlt.local.process import GrpcServiceProcess, RolloutServerProcess
from tlt.paths import BUNDLED_MODEL
from tlt.rollout.client import server_load

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rollout_server(tmp_path_factory) -> Iterator[RolloutServerProcess]:
    log = tmp_path_factory.mktemp("trainer-service") / "server.log"
    with RolloutServerProcess(BUNDLED_MODEL, log, args=["--random-seed", "0"]).start() as server:
        yield server


def _trainer(redis_server, rollout_server, root: Path) -> GrpcServiceProcess:
    args = ["--rollout-servers", rollout_server.url, "--runs-dir", str(root / "runs"), "--lock-ttl-s", "3"]
    return GrpcServiceProcess("trainer", root / "trainer.log", args=args, env=redis_server.client_env())


def _steps(events: list[JobEvent]) -> list[int]:
    return [e.step.step for e in events if e.step is not None]


def test_a_killed_trainer_resumes_the_job_at_the_next_step(redis_server, rollout_server, tmp_path: Path) -> None:
    spec = JobSpec(name="resume-me", steps=5, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=160, eval_every=2, eval_problems=16)
    trainer = _trainer(redis_server, rollout_server, tmp_path).start(120)
    try:
        with JobClient(trainer.target) as client:
            client.submit(spec)
            before: list[JobEvent] = []
            for event in client.watch(spec.name):
                before.append(event)
                if event.step is not None and event.step.step == 1:
                    break
        trainer.kill()  # step 2 is in flight
        killed_at = time.monotonic()
        trainer.start(120)
        with JobClient(trainer.target) as client:
            after = list(client.watch(spec.name, before[-1].event_id))
            job = client.get(spec.name)
    finally:
        trainer.stop()
    resumed = next(e for e in after if e.state == "RUNNING")
    print(f"steps before the kill {_steps(before)}, after {_steps(after)}; '{resumed.message}' "
          f"{resumed.time - time.time() + time.monotonic() - killed_at:.1f} s after the kill")  # fmt: skip
    assert _steps(before) == [0, 1] and _steps(after) == [2, 3, 4]
    assert resumed.message == "resuming from step-2" and job.resumed == 1
    assert job.state == "SUCCEEDED" and job.steps_done == 5
    assert [e.step.step for e in before + after if e.step is not None and e.step.eval_accuracy >= 0] == [1, 3, 4]
    assert next(e for e in before if e.eval_accuracy >= 0).message.startswith("held-out accuracy before training")
    # A resumed step's samples came from the policy version the checkpoint recorded (no stale samples).
    assert all(e.step.stale_samples == 0 and e.step.policy_version == e.step.step for e in after if e.step is not None)
    assert sorted(p.name for p in (tmp_path / "runs" / spec.name / "checkpoints").iterdir()) == ["step-4", "step-5"]


def test_cancel_stops_the_job_and_frees_the_rollout_server(redis_server, rollout_server, tmp_path: Path) -> None:
    spec = JobSpec(name="cancel-me", steps=50, prompts_per_step=32, samples_per_prompt=8, max_new_tokens=512, eval_every=0)
    with _trainer(redis_server, rollout_server, tmp_path).start(120) as trainer, JobClient(trainer.target) as client:
        client.submit(spec)
        deadline = time.monotonic() + 120
        while not (client.get(spec.name).state == "RUNNING" and server_load(rollout_server.url) > 0):
            assert time.monotonic() < deadline, "the job never reached the rollout server"
            time.sleep(0.1)
        time.sleep(1.0)
        cancelled_at = time.monotonic()
        client.cancel(spec.name)
        while server_load(rollout_server.url) > 0:
            assert time.monotonic() < cancelled_at + 30, "the server kept generating for the cancelled job"
            time.sleep(0.05)
        freed_s = time.monotonic() - cancelled_at
        events = list(client.watch(spec.name))
    print(f"server idle {freed_s:.2f} s after CancelJob; final event: {events[-1]}")
    assert events[-1].state == "CANCELLED" and events[-1].message == "cancelled by a client"
    assert _steps(events) == []
