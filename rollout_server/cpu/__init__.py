"""CPU support for SGLang: pure-PyTorch versions of the `sgl_kernel` CPU ops.

Active only when SGLang runs on the CPU (`SGLANG_USE_CPU_ENGINE=1`) and no real `sgl_kernel`
package is installed, so it never shadows the real kernels on a GPU machine.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
# SGLang's EAGLE path wraps small tensor helpers in torch.compile; on the CPU, Inductor spends ~20 s
# compiling C++ on the first speculative request (and needs a compiler at all) to save microseconds.
DYNAMO_DISABLE_ENV = "TORCHDYNAMO_DISABLE"
SHIM_DIR = Path(__file__).with_name("kernels")
# glibc returns every freed block above its mmap threshold to the kernel, so the step's large
# temporaries (gathered KV, attention scores) come back as fresh pages the kernel must zero at each
# forward. Keeping them in the heap made the CPU attention ops 4-5x faster at batch 64 (measured).
# 32 MiB is the most glibc accepts for the threshold; the trim threshold stops it shrinking the heap.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024), "MALLOC_TRIM_THRESHOLD_": str(1024 * 1024 * 1024)}


def cpu_engine_requested(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Whether SGLang is being started on its CPU engine."""
    return environ.get(CPU_ENGINE_ENV, "").lower() in {"1", "true", "yes"}


def real_sgl_kernel_installed() -> bool:
    """Whether an `sgl_kernel` other than our stand-in can be imported."""
    spec = importlib.util.find_spec("sgl_kernel")
    return spec is not None and spec.origin is not None and not Path(spec.origin).is_relative_to(SHIM_DIR)


def cpu_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment for SGLang's CPU engine: the engine switch, torch.compile off and glibc's
    malloc thresholds (unless the caller set them), and our `sgl_kernel` stand-in on PYTHONPATH
    unless a real one is installed. SGLang's scheduler processes inherit it; glibc reads its
    variables only when a process starts, so in a process already running (the launcher, whose
    forked children inherit its heap settings) `fork_start` applies them with mallopt."""
    env = dict(environ)
    env[CPU_ENGINE_ENV] = "1"
    env.setdefault(DYNAMO_DISABLE_ENV, "1")
    for name, value in MALLOC_ENV.items():
        env.setdefault(name, value)
    if not real_sgl_kernel_installed():
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(SHIM_DIR) not in paths:
            paths.append(str(SHIM_DIR))
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def activate_in_this_process() -> None:
    """Apply `cpu_environment` to the running interpreter (before SGLang is imported)."""
    env = cpu_environment(dict(os.environ))
    os.environ.update(env)
    for path in env.get("PYTHONPATH", "").split(os.pathsep):
        if path and path not in sys.path:
            sys.path.append(path)
