"""Test helpers: waiting for a condition, and the live processes of process groups (from /proc)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def poll(condition: Callable[[], object], timeout_s: float, poll_s: float = 0.2) -> object | None:
    """The first truthy value of `condition()`, polled until `timeout_s`; None when none came."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(poll_s)
    return None


def until(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.2) -> object:
    """The first truthy value of `condition()`, polled until `timeout_s` (then AssertionError)."""
    if result := poll(condition, timeout_s, poll_s):
        return result
    raise AssertionError(f"timed out waiting for {what}")


def live_in_groups(groups: set[int], command_part: bytes = b"") -> list[tuple[int, str]]:
    """(pid, command line) of the processes (zombies left out) in these process groups whose
    command line contains `command_part`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) in groups and state != "Z" and command_part in cmdline:
            found.append((int(proc.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found
