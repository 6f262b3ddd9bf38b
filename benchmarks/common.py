"""What every benchmark records beside its figures: machine, versions, command; and where."""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def environment() -> dict[str, Any]:
    """Cores, memory, Python and library versions, and the command line that ran."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "versions": {name: version(name) for name in ("torch", "transformers", "sglang", "tlt")},
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks." + Path(sys.argv[0]).stem, *sys.argv[1:]]),
    }


def write_json(name: str, data: dict[str, Any]) -> Path:
    """Write `results/<name>.json` with the environment attached; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"environment": environment(), **data}, indent=2) + "\n")
    return path
