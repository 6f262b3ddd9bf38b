"""The child-process helper: started once, stopped as a group, killed on demand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tlt.local.process import ServerStartError, ServiceProcess


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
