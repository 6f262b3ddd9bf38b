"""The `tlt` command line, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TLT = [sys.executable, "-m", "tlt.cli"]


def test_help_lists_the_commands() -> None:
    out = subprocess.run([*TLT, "--help"], capture_output=True, text=True, check=False, timeout=120).stdout
    for command in ("run", "rollout", "submit", "watch", "cancel", "list", "make-tiny-model", "model-stats"):
        assert command in out


def test_rollout_rejects_a_directory_that_is_no_checkpoint(tmp_path: Path) -> None:
    result = subprocess.run(
        [*TLT, "rollout", "--model", str(tmp_path), "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert result.returncode != 0
    assert "config.json" in result.stderr + result.stdout


@pytest.mark.slow
def test_rollout_rolls_out_a_batch_and_writes_its_records(tmp_path: Path) -> None:
    result = subprocess.run(
        [*TLT, "rollout", "--prompts", "6", "--samples", "3", "--runs-dir", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accuracy" in result.stdout and "p99" in result.stdout
    (run_dir,) = list(tmp_path.iterdir())
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 18
    assert {(r["a"], r["b"]) for r in rollouts} and {r["sample"] for r in rollouts} == {0, 1, 2}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["summary"]["count"] == 18
    assert 0.0 <= summary["tail_time_share"] < 1.0
    assert all(r["finished_s"] > 0 for r in rollouts)
    assert summary["summary"]["accuracy"] == pytest.approx(sum(r["reward"] for r in rollouts) / 18)
    assert (run_dir / "rollout_server.log").exists()
    # The default is adaptive speculation with the bundled drafter: every response was verified.
    assert summary["speculative"] == "adaptive"
    assert all(r["spec_verify_ct"] >= 1 for r in rollouts)
    assert summary["spec_accept_length"] >= 1.0


@pytest.mark.parametrize(
    ("text", "field"), [("name: x\nsamples_per_prompt: 1\n", "samples_per_prompt"), ("name: x\nsteps: -1\n", "steps")]
)
def test_run_refuses_a_bad_job_file_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(text)
    command = [*TLT, "run", str(job), "--runs-dir", str(tmp_path / "runs")]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 2 and field in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--history-arms", "[2, 2]"], "distinct draft lengths"), (["--history-arms", "2,4"], "JSON list"),
     (["--history-arms", "[4]", "--speculative", "always"], "needs --speculative adaptive")],
)  # fmt: skip
def test_run_refuses_bad_history_arms_before_starting_anything(tmp_path: Path, args: list[str], message: str) -> None:
    command = [*TLT, "run", *args, "--runs-dir", str(tmp_path / "runs")]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 2 and message in " ".join(result.stderr.split()), result.stderr
    assert not (tmp_path / "runs").exists()


def test_run_adds_the_default_history_arms_to_adaptive_speculation_only() -> None:
    from tlt.cli import _history_arms
    from tlt.local.cluster import DEFAULT_HISTORY_ARMS

    assert _history_arms(None, "adaptive") == DEFAULT_HISTORY_ARMS and DEFAULT_HISTORY_ARMS
    assert _history_arms(None, "always") == () and _history_arms(None, "off") == ()
    assert _history_arms("[]", "adaptive") == () and _history_arms("[3, 5]", "adaptive") == (3, 5)


@pytest.mark.slow
def test_run_trains_the_bundled_job_and_writes_its_records(tmp_path: Path) -> None:
    """The README's main command, shortened to two steps on one server; policy versions go through
    Redis and the policy followers, and the trainer shards the policy over two ranks (one run covers
    all three: each costs a minute)."""
    result = subprocess.run(
        [*TLT, "run", "--steps", "2", "--servers", "1", "--policy-channel", "redis", "--trainer-ranks", "2", "--runs-dir", str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCEEDED" in result.stdout
    (run_dir,) = list(tmp_path.iterdir())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and all(m["samples"] == 256 for m in metrics)
    assert metrics[-1]["eval_accuracy"] >= 0 and all(m["spec_accept_length"] > 1.0 for m in metrics)
    assert all(m["drafter_version"] >= 1 for m in metrics)  # registered with the drafter service
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1", "step-2"]
    report = (run_dir / "report.md").read_text()
    assert report.count("\n| 0 |") == 1 and report.count("\n| 1 |") == 1
    for plot in ("step_time.png", "reward.png", "accept_length.png", "sd_timeline.png"):
        assert (run_dir / plot).stat().st_size > 1000
    for log in ("redis", "drafter_service", "rollout-0", "spot-0", "trainer"):
        assert (run_dir / "logs" / f"{log}.log").exists()
    assert [m["stale_samples"] for m in metrics] == [0, 0]
    follower_log = (run_dir / "logs" / "follower-0.log").read_text()
    assert "serving policy v0" in follower_log and "serving policy v1" in follower_log
    assert not (run_dir / "policy").exists()  # nothing went through the disk channel
    assert "rank 1: holding its shard" in (run_dir / "logs" / "trainer.log").read_text()
    assert len(list((run_dir / "checkpoints" / "step-2" / "trainer_state_dcp").glob("*.distcp"))) == 2  # one per rank


def test_drafter_fresh_writes_the_drafter_services_version_1(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from drafter_service.store import checkpoint_files
    from tlt.paths import BUNDLED_MODEL
    from tlt.rpc.drafter_api import RegisterDrafterRequest

    out = tmp_path / "fresh"
    result = subprocess.run([*TLT, "drafter", "fresh", "--model", str(BUNDLED_MODEL), "--out", str(out)], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    config, tensors = checkpoint_files(RegisterDrafterRequest(job_id="j", policy_path=str(BUNDLED_MODEL)))
    written = load_file(str(out / "model.safetensors"))
    assert (out / "config.json").read_text() == config and written.keys() == tensors.keys()
    assert all(written[name].equal(tensors[name]) for name in tensors)
    refused = subprocess.run([*TLT, "drafter", "fresh", "--model", str(tmp_path), "--out", str(tmp_path / "x")], capture_output=True, text=True, check=False, timeout=120)
    assert refused.returncode == 2 and "config.json" in refused.stdout and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_drafter_train_writes_an_sglang_draft_and_its_history(tmp_path: Path) -> None:
    out = tmp_path / "drafter"
    result = subprocess.run(
        [*TLT, "drafter", "train", "--out", str(out), "--problems", "24", "--samples", "1",
         "--eval-problems", "4", "--epochs", "2", "--max-new-tokens", "200"],
        capture_output=True, text=True, check=False, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accept length" in result.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLMEagle"]
    assert (out / "model.safetensors").exists()
    history = json.loads((out / "history.json").read_text())
    assert [e["epoch"] for e in history["epochs"]] == [1, 2]
    assert all(1.0 <= e["accept_length"] <= 5.0 for e in history["epochs"])


@pytest.mark.slow
def test_a_server_that_cannot_start_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    from tlt.local.process import RolloutServerProcess, ServerStartError

    (tmp_path / "config.json").write_text("{}")  # passes our check, but SGLang cannot load it
    server = RolloutServerProcess(tmp_path, tmp_path / "server.log")
    with pytest.raises(ServerStartError, match="exited"):
        server.start(timeout_s=240)
    assert server.process is None
