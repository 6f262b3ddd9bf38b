"""`tlt run` leaves nothing behind whatever ends it, and its local services require its token.

Each test starts the real thing (`tlt run` on the bundled job: Redis, the drafter service, a rollout
server with its SGLang processes, a spot worker, a policy follower and the trainer), waits until
the job is mid-way, ends `tlt run` the way a user's machine would, and looks for survivors by
process group (each service leads its own) and by the ports they listened on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests.processes import live_in_groups, until
from tlt.jobs.client import JobClient
from tlt.v1 import drafter_pb2 as drafter_pb
from tlt.v1 import drafter_pb2_grpc

TLT = [sys.executable, "-m", "tlt.cli"]
GONE_WITHIN_S = 15.0

pytestmark = pytest.mark.slow


def _start_run(runs: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`tlt run` in a session of its own (as in a terminal), once its job has finished a step."""
    command = [*TLT, "run", "--steps", "6", "--servers", "1", "--policy-channel", "redis", "--runs-dir", str(runs)]
    log = (runs.parent / "tlt-run.log").open("wb")
    run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def first_step() -> Path | None:
        assert run.poll() is None, (runs.parent / "tlt-run.log").read_text()
        dirs = list(runs.glob("*/metrics.jsonl"))
        return dirs[0].parent if dirs and dirs[0].read_text().strip() else None

    return run, until(first_step, 600, "the job's first step")


def _processes(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines()]


def _listening(ports: set[int]) -> list[int]:
    open_ports = []
    for port in ports:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                open_ports.append(port)
    return open_ports


def _assert_nothing_left(run_dir: Path, since: float) -> None:
    processes = _processes(run_dir)
    kinds = {p["kind"] for p in processes}
    assert {"redis", "drafter_service", "rollout server", "rollout_server.spot_worker", "trainer"} <= kinds
    assert "rollout_server.policy_follower" in kinds
    groups = {p["pid"] for p in processes}
    ports = {p["port"] for p in processes if p["port"]}
    until(lambda: not live_in_groups(groups) and not _listening(ports), GONE_WITHIN_S, "the run's processes to end")
    assert time.monotonic() - since <= GONE_WITHIN_S


def _states(run_dir: Path) -> list[str]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e["state"] for e in events if e["state"]]


def test_sigterm_cancels_the_job_and_stops_everything_and_the_services_need_the_token(tmp_path: Path) -> None:
    run, run_dir = _start_run(tmp_path / "runs")
    connection = json.loads((run_dir / "connection.json").read_text())
    assert (run_dir / "connection.json").stat().st_mode & 0o777 == 0o600
    job_id = run_dir.name

    # Without the token (or with another) the job API and the drafter service refuse; health stays open.
    for token in (None, "not-the-token"):
        with JobClient(connection["trainer"], token) as stranger, pytest.raises(grpc.RpcError) as refused:
            stranger.list()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    drafter_port = next(p["port"] for p in _processes(run_dir) if p["kind"] == "drafter_service")
    with grpc.insecure_channel(f"127.0.0.1:{drafter_port}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            drafter_pb2_grpc.DrafterServiceStub(channel).GetDrafter(drafter_pb.DrafterRef(job_id=job_id), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert connection["token"] not in (tmp_path / "tlt-run.log").read_text()  # never printed

    # With it (found in the run directory), `tlt watch` follows the job to its end.
    watch = subprocess.Popen(
        [*TLT, "watch", job_id, "--runs-dir", str(tmp_path / "runs")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    time.sleep(3)
    assert watch.poll() is None, watch.stdout.read().decode() if watch.stdout else ""
    signalled = time.monotonic()
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 128 + signal.SIGTERM
    out, _ = watch.communicate(timeout=60)
    assert f"{job_id}: CANCELLED" in out.decode(), out.decode()
    _assert_nothing_left(run_dir, signalled)
    assert _states(run_dir)[-1] == "CANCELLED"
    assert (run_dir / "report.md").exists() and not (run_dir / "connection.json").exists()


def test_sighup_is_handled_like_ctrl_c(tmp_path: Path) -> None:
    run, run_dir = _start_run(tmp_path / "runs")
    signalled = time.monotonic()
    run.send_signal(signal.SIGHUP)
    assert run.wait(timeout=120) == 128 + signal.SIGHUP
    _assert_nothing_left(run_dir, signalled)
    assert _states(run_dir)[-1] == "CANCELLED"
    assert (run_dir / "report.md").exists()


def test_sigkill_leaves_no_process_behind(tmp_path: Path) -> None:
    run, run_dir = _start_run(tmp_path / "runs")
    signalled = time.monotonic()
    os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=10)
    _assert_nothing_left(run_dir, signalled)
