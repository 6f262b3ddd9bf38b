"""`python -m tlt.local.guard CMD...`: run CMD so that it dies with the process that started us.

Single-machine mode starts each service in its own process group (so that Ctrl-C in the terminal
reaches only `tlt run`, which then cancels the job before stopping them). A process group outlives
its parent, though: a `tlt run` killed by SIGKILL, or crashing, would leave every service running.
`PR_SET_PDEATHSIG` alone does not fix that, since the kernel ties it to the *thread* that forked
the child (the local cluster starts servers from worker threads), and it does not reach SGLang's
scheduler processes, the service's own children. So each service runs under this guard, which
watches the process that started it and, when that one is gone, kills the whole process group:
the service and everything it spawned.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


def _die_with_guard():
    """What the child runs before exec: SIGKILL when the guard's (single) thread dies. None where
    there is no prctl (not Linux): the parent watch still holds there."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def guard(argv: list[str], poll_s: float = POLL_S) -> int:
    """Run `argv` in our process group until it exits (its exit status is ours) or until our
    parent is gone (then the whole group is killed)."""
    parent = os.getppid()
    # The group's SIGTERM/SIGINT/SIGHUP reach the child too: let it shut down and report how.
    # (Handlers set here are reset to the default in the child by exec.)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    # The guard has one thread, so preexec_fn cannot deadlock on another thread's lock.
    child = subprocess.Popen(argv, preexec_fn=_die_with_guard())  # noqa: PLW1509
    while True:
        try:
            code = child.wait(timeout=poll_s)
            return code if code >= 0 else 128 - code
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)
            time.sleep(poll_s)  # not reached: SIGKILL reaches us too


def main() -> None:
    """Entry point of `python -m tlt.local.guard`."""
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tlt.local.guard CMD [ARG...]")
    sys.exit(guard(sys.argv[1:]))


if __name__ == "__main__":
    main()
