"""Start SGLang's scheduler and detokenizer processes by fork on the CPU engine.

SGLang forces the `spawn` start method (CUDA cannot be forked), so each child re-imports SGLang,
torch and transformers: about 6 s of CPU per child, paid by every server start (measured warm on
2 cores: 17 s to healthy with spawn, 10 s with fork). On the CPU engine nothing is initialised
that fork would break: no CUDA context exists, and no torch op has run in the launcher before
its children start. What the spawned children got from their fresh start, a forked child
inherits instead, so the launcher sets it on itself first: glibc's malloc thresholds (read from
the environment only when a process starts) and torch's thread count (read at torch's import).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os

from rollout_server.cpu import MALLOC_ENV

# The mallopt(3) parameter that each of MALLOC_ENV's variables sets when a process starts.
_MALLOPT_PARAM = {"MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1}


def _apply_malloc_environment() -> None:
    """What glibc would have read from MALLOC_ENV's variables at our start, applied now (the
    launcher sets them after it)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: the variables mean nothing there either
        return
    for name in MALLOC_ENV:
        if name in os.environ:
            mallopt(_MALLOPT_PARAM[name], int(os.environ[name]))


def fork_sglang_children(cpu_threads: int) -> None:
    """Make SGLang start its children by fork, with our malloc settings and `cpu_threads` torch
    threads; call after SGLang is imported and before its server starts (CPU engine only)."""
    import torch
    from sglang.srt.entrypoints import engine

    _apply_malloc_environment()
    torch.set_num_threads(cpu_threads)
    set_envs_and_config = engine._set_envs_and_config

    def set_envs_and_config_then_fork(*args, **kwargs):
        set_envs_and_config(*args, **kwargs)
        multiprocessing.set_start_method("fork", force=True)

    # SGLang calls it through its module's global (engine.py's launch), so replacing that is enough.
    engine._set_envs_and_config = set_envs_and_config_then_fork
