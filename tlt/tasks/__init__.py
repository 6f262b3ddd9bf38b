"""Tasks with verifiable answers: problems, worked solutions and rewards."""

from __future__ import annotations

from pathlib import Path

from tlt.tasks.gcd import GcdProblem, GcdTask
from tlt.tasks.jsonl import JsonlTask, MathProblem

__all__ = ["GcdProblem", "GcdTask", "JsonlTask", "MathProblem", "task_of"]


def task_of(name: str, dataset_path: Path | None = None) -> GcdTask | JsonlTask:
    """The task a job names: `gcd` (the tiny model's), or `jsonl` (math problems from a file)."""
    if name == "gcd":
        return GcdTask()
    if name == "jsonl" and dataset_path is not None:
        return JsonlTask(dataset_path)
    raise ValueError(f"unknown task {name!r} (or no dataset_path for jsonl)")
