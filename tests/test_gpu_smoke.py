"""`tools/gpu_smoke.py`, the first check on a GPU node, run here on the CPU with the bundled model:
every step but the driver check and the memory release runs the same code, so the script a GPU
node runs is known to work up to what only a GPU can show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = (
    "imports and driver",
    "EAGLE draft checkpoint",
    "rollout server with an EAGLE draft",
    "greedy and sampled requests at concurrency 1 and large",
    "drafter blob swapped in",
    "KV-cache hand-off cycle",
    "spot-training slice committed",
)


@pytest.mark.slow
def test_every_step_of_the_gpu_smoke_test_passes_on_the_cpu(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "tools" / "gpu_smoke.py"), "--device", "cpu", "--concurrency", "32", "--work-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for step in STEPS:
        assert f"PASS  {step} (" in result.stdout, output
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"passed": len(STEPS), "failed": []}


@pytest.mark.slow
def test_a_gpu_run_on_a_machine_without_one_fails_and_says_why(tmp_path: Path) -> None:
    """No GPU here: the driver step and the server step fail, saying why, and the exit status counts them."""
    command = [sys.executable, str(ROOT / "tools" / "gpu_smoke.py"), "--device", "cuda", "--work-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    lines = result.stdout.splitlines()
    assert next(line for line in lines if "imports and driver" in line).startswith("FAIL") and "sees no GPU" in result.stdout
    server = next(line for line in lines if "rollout server with an EAGLE draft" in line)
    assert server.startswith("FAIL") and "exited" in server
    assert "device cuda: torch" in (tmp_path / "rollout-server.log").read_text()  # the server refused, saying why
    summary = json.loads(lines[-1])
    assert result.returncode == len(summary["failed"]) >= 2 and "EAGLE draft checkpoint" not in summary["failed"]
