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


def test_rl_step_quick_runs_every_arm_and_trl_to_the_end() -> None:
    data = _run_quick("rl_step")
    assert list(data["arms"]) == ["SD off", "adaptive SD", "adaptive SD + history", "TLT"]
    for arm in data["arms"].values():
        (run,) = arm["runs"]
        assert run["state"] == "SUCCEEDED" and [s["step"] for s in run["steps"]] == [0, 1]
        assert arm["mean_step_s_reps"] == [run["mean_step_s"]] and arm["runs_what"]
    assert data["trl"]["reps"] == 1 and len(data["trl"]["rewards"]) == 2
    assert data["step_time_ratio_trl_over_tlt"] > 0 and data["parity_tlt_vs_off"]["steps"] == 2
    accept = {name: [s["spec_accept_length"] for s in arm["runs"][0]["steps"]] for name, arm in data["arms"].items()}
    assert all(a == 0 for a in accept["SD off"]) and all(a > 1.0 for name in list(accept)[1:] for a in accept[name])
    assert set(data["contributions"]) == {
        "adaptive SD (off / adaptive SD)", "history drafts (adaptive SD / + history)", "spot training (+ history / TLT)"
    }  # fmt: skip
    assert data["tlt_over_off"]["step"] > 0
    assert (RESULTS / "rl_step_quick.png").stat().st_size > 0


def test_the_summary_table_has_the_quick_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "benchmarks.summary", "--quick"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    table = (RESULTS / "summary_quick.md").read_text()
    assert "TLT vs TRL" in table and "learning parity" in table and "CPU cores" in table
