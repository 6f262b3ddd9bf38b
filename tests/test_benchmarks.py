"""Smoke runs of the benchmarks in their --quick mode: they still execute end to end and write
their JSON and plot. Timing goals are never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.common import RESULTS

pytestmark = pytest.mark.slow


def _run_quick(name: str) -> dict:
    """Run `benchmarks.<name> --quick` as a user would; its JSON."""
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--quick"], capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads((RESULTS / f"{name}_quick.json").read_text())


def test_long_tail_rollout_quick_runs_all_three_modes_with_identical_outputs() -> None:
    data = _run_quick("long_tail_rollout")
    (scenario,) = data["scenarios"]
    assert [m["mode"] for m in scenario["modes"]] == ["no SD", "always-on SD", "adaptive SD"]
    assert scenario["outputs_identical"]
    adaptive = scenario["modes"][-1]
    assert adaptive["timeline"] and any(s["draft_steps"] >= 0 for s in adaptive["timeline"])
    assert (RESULTS / "long_tail_rollout_quick.png").stat().st_size > 0


def test_spot_training_quick_measures_both_configurations() -> None:
    data = _run_quick("spot_training")
    assert sorted({row["spot_worker"] for row in data["rows"]}) == [False, True]
    assert len(data["rows"]) == 2 * data["rounds"]
    assert data["batch_s_with_worker"] > 0 and data["batch_s_without_worker"] > 0


def test_rl_step_quick_runs_both_modes_and_trl_to_the_end() -> None:
    data = _run_quick("rl_step")
    assert list(data["modes"]) == ["TLT (adaptive SD + spot-trained drafter)", "SD off"]
    for mode in data["modes"].values():
        assert mode["state"] == "SUCCEEDED" and [s["step"] for s in mode["steps"]] == [0, 1]
    assert data["trl"]["state"] == "SUCCEEDED" and len(data["trl"]["rewards"]) == len(data["trl"]["step_s"]) == 2
    assert data["step_time_ratio_trl_over_tlt"] > 0 and data["parity_tlt_vs_off"]["steps"] == 2
    tlt, off = data["modes"].values()
    assert all(s["spec_accept_length"] > 1.0 for s in tlt["steps"]) and all(s["spec_accept_length"] == 0 for s in off["steps"])
    assert data["step_time_ratio_off_over_tlt"] > 0
    assert (RESULTS / "rl_step_quick.png").stat().st_size > 0


def test_the_summary_table_has_the_quick_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "benchmarks.summary", "--quick"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    table = (RESULTS / "summary_quick.md").read_text()
    assert "TLT vs TRL" in table and "learning parity" in table and "CPU cores" in table
