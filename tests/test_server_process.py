"""The child-process helper: started once, stopped as a group, killed on demand."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tlt.local.process import ServerStartError, ServiceProcess, SpotWorkerProcess, free_port


class Sleeper(ServiceProcess):
    kind = "sleeper"

    def __init__(self, log_path: Path, code: str = "import time; time.sleep(60)", ready: bool = True) -> None:
        super().__init__(log_path)
        self.code, self.ready = code, ready

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]

    def healthy(self) -> bool:
        return self.ready and self.alive()


def test_with_on_a_started_process_does_not_start_a_second_one(tmp_path: Path) -> None:
    sleeper = Sleeper(tmp_path / "log").start(timeout_s=10)
    first = sleeper.process
    with sleeper:
        assert sleeper.process is first
    assert first.poll() is not None and not sleeper.alive()


def test_a_process_that_dies_at_start_reports_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="boom"):
        Sleeper(tmp_path / "log", "import sys; print('boom', flush=True); sys.exit(3)", ready=False).start(timeout_s=10)


def test_kill_stops_it_at_once(tmp_path: Path) -> None:
    sleeper = Sleeper(tmp_path / "log").start(timeout_s=10)
    process = sleeper.process
    sleeper.kill()
    assert process.returncode == -9 and not sleeper.alive()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="kernel without autogroups")
def test_session_nice_lowers_the_new_session_only(tmp_path: Path) -> None:
    """With autogroups a thread's nice counts only inside its session: a spot worker must lower
    its session's priority too, and never the session of whoever started it."""
    ours = Path("/proc/self/autogroup").read_text()
    sleeper = Sleeper(tmp_path / "log")
    sleeper.session_nice = 19
    with sleeper.start(timeout_s=10):
        deadline = time.monotonic() + 10
        while not (children := _children(sleeper.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Path(f"/proc/{children[0]}/autogroup").read_text().split()[-2:] == ["nice", "19"]  # the service under its guard
    assert Path("/proc/self/autogroup").read_text() == ours


def test_spot_worker_session_nice_is_opt_in_and_apart_from_the_threads_nice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TLT_SPOT_SESSION_NICE", raising=False)
    assert SpotWorkerProcess(tmp_path / "log", env={"TLT_SPOT_NICE": "19"}).session_nice == 0
    assert SpotWorkerProcess(tmp_path / "log", env={"TLT_SPOT_SESSION_NICE": "19"}).session_nice == 19
    monkeypatch.setenv("TLT_SPOT_SESSION_NICE", "7")
    assert SpotWorkerProcess(tmp_path / "log").session_nice == 7


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    """Outgoing connections get ports from the ephemeral range: one could take a port found there
    before the child that is to bind it does."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(port < ephemeral_low for port in ports)
