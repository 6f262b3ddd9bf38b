"""Whole RL steps of the bundled job with TLT (adaptive SD, drafter retrained by spot workers), with
speculation off (same system, same seeds), each on a fresh local cluster (`tlt run`'s processes),
and with TRL's `GRPOTrainer` (`benchmarks.trl_grpo`: same model, task, prompts, batch, samples per
prompt, max length and loss), one after the other in one run.

    python -m benchmarks.rl_step [--quick] [--steps N] [--no-trl]

Reports per-step time by phase and reward for each, the ratios of mean step times (SD off / TLT,
TRL / TLT), the learning-parity tests (`benchmarks.parity`) and plots step times and the reward
curves side by side.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from matplotlib.figure import Figure

from benchmarks.common import RESULTS, write_json
from benchmarks.parity import reward_parity
from benchmarks.trl_grpo import run_trl
from tlt.jobs.records import StepMetrics
from tlt.jobs.spec import JobSpec
from tlt.local.cluster import ClusterConfig
from tlt.local.run import LocalRun, run_job_locally
from tlt.paths import BUNDLED_JOB

TRL = "TRL GRPOTrainer (transformers generate)"
MODES = {
    "TLT (adaptive SD + spot-trained drafter)": ClusterConfig(speculative="adaptive", spot_training=True),
    "SD off": ClusterConfig(speculative="off", spot_training=False),
}


def _summary(run: LocalRun) -> dict:
    steps = run.steps
    # Held-out evaluations run inside some steps; rollout + update + publish is the RL step proper.
    proper = [s.rollout_s + s.train_s + s.publish_s for s in steps]
    return {
        "state": run.state,
        "startup_s": run.startup_s,
        "job_s": run.job_s,
        "mean_step_s": statistics.fmean(proper),
        "mean_rollout_s": statistics.fmean(s.rollout_s for s in steps),
        "mean_tail_s": statistics.fmean(s.tail_s for s in steps),
        "mean_train_s": statistics.fmean(s.train_s for s in steps),
        # Sampled runs generate different tokens: the rate is the like-for-like rollout figure.
        "rollout_tokens_per_s": sum(s.response_tokens for s in steps) / sum(s.rollout_s for s in steps),
        "reward_first_half": statistics.fmean(s.reward_mean for s in steps[: len(steps) // 2] or steps),
        "reward_second_half": statistics.fmean(s.reward_mean for s in steps[len(steps) // 2 :]),
        "steps": [s.model_dump() for s in steps],
        "baseline_eval_accuracy": next((e.eval_accuracy for e in run.events if e.step is None and e.eval_accuracy >= 0), None),
    }


def _plot(results: dict[str, dict], trl: dict | None, out: Path) -> None:
    fig = Figure(figsize=(15, 4.2))
    ax_step, ax_rollout, ax_reward = fig.subplots(1, 3)
    for mode, data in results.items():
        steps = [StepMetrics(**s) for s in data["steps"]]
        x = [s.step for s in steps]
        ax_step.plot(x, [s.rollout_s + s.train_s + s.publish_s for s in steps], marker="o", label=mode)
        ax_rollout.plot(x, [s.rollout_s for s in steps], marker="o", label=f"{mode}: rollout")
        ax_rollout.plot(x, [s.tail_s for s in steps], ls="--", label=f"{mode}: tail (last 10%)")
        ax_reward.plot(x, [s.reward_mean for s in steps], marker="o", label=f"{mode}: training reward")
        evals = [(s.step + 1, s.eval_accuracy) for s in steps if s.eval_accuracy >= 0]
        if data["baseline_eval_accuracy"] is not None:
            evals.insert(0, (0, data["baseline_eval_accuracy"]))
        if evals:
            ax_reward.plot(*zip(*evals, strict=True), marker="s", ls=":", label=f"{mode}: held-out")
    ax_step.set(xlabel="step", ylabel="seconds", title="RL step (rollout + update + publish)")
    ax_rollout.set(xlabel="step", ylabel="seconds", title="rollout and its tail")
    if trl is not None:
        ax_step.plot(range(len(trl["step_s"])), trl["step_s"], marker="^", label=TRL)
        ax_reward.plot(range(len(trl["rewards"])), trl["rewards"], marker="^", label=f"{TRL}: training reward")
    ax_reward.set(xlabel="step", ylabel="reward / accuracy", title="learning (same prompts and seeds)")
    for ax in (ax_step, ax_rollout, ax_reward):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(
    quick: Annotated[bool, typer.Option(help="2 steps of 8 prompts on one server: checks the benchmark runs")] = False,
    steps: Annotated[int | None, typer.Option(min=1, help="RL steps per mode [default: the bundled job's]")] = None,
    servers: Annotated[int, typer.Option(min=1, max=8)] = 2,
    trl: Annotated[bool, typer.Option(help="also run the job with TRL's GRPOTrainer")] = True,
) -> None:
    spec = JobSpec.from_yaml(BUNDLED_JOB)
    update: dict = {"steps": steps or spec.steps}
    if quick:
        update = {"steps": 2, "prompts_per_step": 8, "eval_every": 0}
        servers = 1
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n, (mode, config) in enumerate(MODES.items()):
            job = spec.model_copy(update={**update, "name": f"rl-step-{n}"})
            config.servers = servers
            run = run_job_locally(job, Path(tmp), config, on_phase=lambda text, m=mode: print(f"[{m}] {text}", flush=True))
            if run.state != "SUCCEEDED":
                raise SystemExit(f"{mode}: the job ended {run.state}: {run.message} (logs: {run.run_dir / 'logs'})")
            results[mode] = _summary(run)
            print(f"[{mode}] {results[mode]['mean_step_s']:.2f} s per step", flush=True)
        trl_result = None
        if trl:
            print(f"[{TRL}] training", flush=True)
            trl_result = run_trl(spec.model_copy(update={**update, "name": "rl-step-trl"}), Path(tmp) / "trl")
            print(f"[{TRL}] {trl_result['mean_step_s']:.2f} s per step", flush=True)
    tlt, off = results.values()
    tlt_rewards = [s["reward_mean"] for s in tlt["steps"]]
    data = {
        "job": {**spec.model_dump(mode="json"), **update},
        "servers": servers,
        "modes": results,
        "step_time_ratio_off_over_tlt": off["mean_step_s"] / tlt["mean_step_s"],
        "rollout_time_ratio_off_over_tlt": off["mean_rollout_s"] / tlt["mean_rollout_s"],
        "tail_time_ratio_off_over_tlt": off["mean_tail_s"] / tlt["mean_tail_s"],
        "rollout_rate_ratio_tlt_over_off": tlt["rollout_tokens_per_s"] / off["rollout_tokens_per_s"],
        "parity_tlt_vs_off": reward_parity(tlt_rewards, [s["reward_mean"] for s in off["steps"]]),
    }
    if trl_result is not None:
        data["trl"] = trl_result
        data["step_time_ratio_trl_over_tlt"] = trl_result["mean_step_s"] / tlt["mean_step_s"]
        data["parity_tlt_vs_trl"] = reward_parity(tlt_rewards, trl_result["rewards"])
    name = "rl_step_quick" if quick else "rl_step"
    path = write_json(name, data)
    _plot(results, trl_result, RESULTS / f"{name}.png")
    versus_trl = f", {data['step_time_ratio_trl_over_tlt']:.2f}x faster per step than TRL" if trl_result else ""
    print(
        f"step {data['step_time_ratio_off_over_tlt']:.2f}x, rollout {data['rollout_time_ratio_off_over_tlt']:.2f}x, "
        f"tail {data['tail_time_ratio_off_over_tlt']:.2f}x faster with TLT than SD off{versus_trl}; "
        f"reward parity with SD off: p={data['parity_tlt_vs_off']['wilcoxon_p']:.2f}; {path}"
    )


if __name__ == "__main__":
    typer.run(main)
