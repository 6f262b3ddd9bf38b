"""Whole RL steps of the bundled job, one arm per piece of TLT, each on a fresh local cluster
(`tlt run`'s processes) with the same seeds and prompts, and with TRL's `GRPOTrainer`
(`benchmarks.trl_grpo`: same model, task, prompts, batch, samples per prompt, max length and loss).
The arms run interleaved (every arm once per repetition, in the same order) so that a drift of the
machine falls on all of them alike, and the spread over repetitions is reported beside each mean.

    python -m benchmarks.rl_step [--quick] [--steps N] [--reps N] [--trl-reps N]

Each arm adds one thing to the one before it, so the ratio of neighbours is that thing's own
contribution: SD off; adaptive SD (EAGLE arms, the bundled drafter frozen, nothing else: no
sample recording, no spot workers); plus history drafts; plus spot training (full TLT). Reports
per-arm step, rollout, tail, update and publish times, the ratios, the learning-parity tests
(`benchmarks.parity`) and plots them.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer
from matplotlib.figure import Figure

from benchmarks.common import RESULTS, write_json
from benchmarks.parity import reward_parity
from benchmarks.trl_grpo import run_trl
from tlt.jobs.spec import JobSpec
from tlt.local.cluster import DEFAULT_HISTORY_ARMS, ClusterConfig
from tlt.local.run import LocalRun, run_job_locally
from tlt.paths import BUNDLED_JOB


@dataclass(frozen=True)
class Arm:
    """One configuration of the system; `runs` says what it runs, for the summary table."""

    name: str
    runs: str
    config: ClusterConfig


ARMS = (
    Arm("SD off", "no speculation, no spot workers", ClusterConfig(speculative="off", spot_training=False)),
    Arm(
        "adaptive SD",
        "bandit over EAGLE arms 0-4 with the bundled drafter frozen; no sample recording, no spot workers",
        ClusterConfig(speculative="adaptive", spot_training=False),
    ),
    Arm(
        "adaptive SD + history",
        f"as adaptive SD, plus history-draft arms {list(DEFAULT_HISTORY_ARMS)} (prompt group's token history)",
        ClusterConfig(speculative="adaptive", history_arms=DEFAULT_HISTORY_ARMS, spot_training=False),
    ),
    Arm(
        "TLT",
        "as adaptive SD + history, with the drafter retrained by spot workers in idle time (samples recorded): "
        "`tlt run`'s defaults",
        ClusterConfig(speculative="adaptive", history_arms=DEFAULT_HISTORY_ARMS, spot_training=True),
    ),
)
TRL = "TRL GRPOTrainer"
TRL_RUNS = "transformers generate in the trainer's process, no speculation"
# Times averaged per arm over repetitions; each one's per-repetition values are kept beside it.
TIMES = ("mean_step_s", "mean_rollout_s", "mean_tail_s", "mean_train_s", "mean_publish_s", "rollout_tokens_per_s")


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
        "mean_publish_s": statistics.fmean(s.publish_s for s in steps),
        # Sampled runs generate different tokens: the rate is the like-for-like rollout figure.
        "rollout_tokens_per_s": sum(s.response_tokens for s in steps) / sum(s.rollout_s for s in steps),
        "rewards": [s.reward_mean for s in steps],
        "steps": [s.model_dump() for s in steps],
        "baseline_eval_accuracy": next((e.eval_accuracy for e in run.events if e.step is None and e.eval_accuracy >= 0), None),
    }


def _halves(rewards: list[float]) -> dict[str, float]:
    half = len(rewards) // 2
    return {"reward_first_half": statistics.fmean(rewards[:half] or rewards), "reward_second_half": statistics.fmean(rewards[half:])}


def _aggregate(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """Means over repetitions, each with its per-repetition values (`<key>_reps`) and the
    per-step reward averaged over repetitions."""
    out: dict = {"reps": len(runs), "runs": runs}
    for key in keys:
        values = [run[key] for run in runs]
        out[key], out[f"{key}_reps"] = statistics.fmean(values), values
    rewards = [statistics.fmean(step) for step in zip(*(run["rewards"] for run in runs), strict=True)]
    return {**out, "rewards": rewards, **_halves(rewards)}


def _ratios(slow: dict, fast: dict) -> dict:
    """slow / fast for step, rollout and tail time: of the means, and per repetition (paired by rep)."""
    out = {}
    for key in ("mean_step_s", "mean_rollout_s", "mean_tail_s"):
        name = key.removeprefix("mean_").removesuffix("_s")
        out[name] = slow[key] / fast[key]
        out[f"{name}_reps"] = [a / b for a, b in zip(slow[f"{key}_reps"], fast[f"{key}_reps"], strict=True)]
    return out


def _plot(arms: dict[str, dict], trl: dict | None, out: Path) -> None:
    fig = Figure(figsize=(16, 4.4))
    ax_bars, ax_rollout, ax_reward = fig.subplots(1, 3)
    names = list(arms) + ([TRL] if trl else [])
    for x, name in enumerate(arms):
        data = arms[name]
        bottom = 0.0
        for key, label, color in (("mean_rollout_s", "rollout", "C0"), ("mean_train_s", "update", "C1"), ("mean_publish_s", "publish", "C2")):
            ax_bars.bar(x, data[key], bottom=bottom, color=color, label=label if x == 0 else None)
            bottom += data[key]
        ax_bars.plot([x] * data["reps"], data["mean_step_s_reps"], "k.", label="each repetition" if x == 0 else None)
        first = data["runs"][0]["steps"]
        ax_rollout.plot([s["step"] for s in first], [s["rollout_s"] for s in first], marker="o", label=f"{name}: rollout")
        ax_rollout.plot([s["step"] for s in first], [s["tail_s"] for s in first], ls="--", label=f"{name}: tail")
        ax_reward.plot(range(len(data["rewards"])), data["rewards"], marker="o", label=name)
    if trl is not None:
        ax_bars.bar(len(arms), trl["mean_step_s"], color="C7")
        ax_bars.plot([len(arms)] * trl["reps"], trl["mean_step_s_reps"], "k.")
        ax_reward.plot(range(len(trl["rewards"])), trl["rewards"], marker="^", label=TRL)
    ax_bars.set_xticks(range(len(names)), names, rotation=15, fontsize=7)
    ax_bars.set(ylabel="seconds per RL step", title="RL step by phase (mean over repetitions)")
    ax_rollout.set(xlabel="step", ylabel="seconds", title="rollout and its tail (last 10%), first repetition")
    ax_reward.set(xlabel="step", ylabel="mean training reward", title="learning (same prompts and seeds)")
    for ax in (ax_bars, ax_rollout, ax_reward):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(
    quick: Annotated[bool, typer.Option(help="2 steps of 8 prompts on one server, once: checks the benchmark runs")] = False,
    steps: Annotated[int | None, typer.Option(min=1, help="RL steps per arm [default: the bundled job's]")] = None,
    servers: Annotated[int, typer.Option(min=1, max=8)] = 2,
    reps: Annotated[int, typer.Option(min=1, max=10, help="repetitions of every TLT-side arm, interleaved")] = 2,
    trl_reps: Annotated[
        int, typer.Option(min=0, max=10, help="repetitions of the TRL arm (its step is ~5x the others'), in the first reps")
    ] = 1,
) -> None:
    spec = JobSpec.from_yaml(BUNDLED_JOB)
    update: dict = {"steps": steps or spec.steps}
    if quick:
        update, servers, reps, trl_reps = {"steps": 2, "prompts_per_step": 8, "eval_every": 0}, 1, 1, min(trl_reps, 1)
    runs: dict[str, list[dict]] = {arm.name: [] for arm in ARMS}
    trl_runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for n, arm in enumerate(ARMS):
                job = spec.model_copy(update={**update, "name": f"rl-step-{n}-{rep}"})
                tag = f"[{arm.name}, rep {rep + 1}/{reps}]"
                run = run_job_locally(job, Path(tmp), replace(arm.config, servers=servers), lambda text, t=tag: print(f"{t} {text}", flush=True))
                if run.state != "SUCCEEDED":
                    raise SystemExit(f"{arm.name}: the job ended {run.state}: {run.message} (logs: {run.run_dir / 'logs'})")
                runs[arm.name].append(_summary(run))
                print(f"{tag} {runs[arm.name][-1]['mean_step_s']:.2f} s per step", flush=True)
            if rep < trl_reps:
                print(f"[{TRL}, rep {rep + 1}/{trl_reps}] training", flush=True)
                trl_runs.append(run_trl(spec.model_copy(update={**update, "name": f"rl-step-trl-{rep}"}), Path(tmp) / f"trl-{rep}"))
                print(f"[{TRL}] {trl_runs[-1]['mean_step_s']:.2f} s per step", flush=True)
    arms = {name: _aggregate(arm_runs, TIMES) for name, arm_runs in runs.items()}
    off, adaptive, history, tlt = (arms[arm.name] for arm in ARMS)
    data: dict = {
        "job": {**spec.model_dump(mode="json"), **update},
        "servers": servers,
        "reps": reps,
        "arms": {arm.name: {"runs_what": arm.runs, **arms[arm.name]} for arm in ARMS},
        "tlt_over_off": _ratios(off, tlt),
        "contributions": {
            "adaptive SD (off / adaptive SD)": _ratios(off, adaptive),
            "history drafts (adaptive SD / + history)": _ratios(adaptive, history),
            "spot training (+ history / TLT)": _ratios(history, tlt),
        },
        "rollout_rate_ratio_tlt_over_off": tlt["rollout_tokens_per_s"] / off["rollout_tokens_per_s"],
        "parity_tlt_vs_off": reward_parity(tlt["rewards"], off["rewards"]),
    }
    trl = None
    if trl_runs:
        trl = _aggregate(trl_runs, ("mean_step_s",))
        data["trl"] = {"runs_what": TRL_RUNS, "trl_version": trl_runs[0]["trl_version"], **trl}
        data["step_time_ratio_trl_over_tlt"] = trl["mean_step_s"] / tlt["mean_step_s"]
        data["parity_tlt_vs_trl"] = reward_parity(tlt["rewards"], trl["rewards"])
    name = "rl_step_quick" if quick else "rl_step"
    path = write_json(name, data)
    _plot(arms, trl, RESULTS / f"{name}.png")
    ratio = data["tlt_over_off"]
    versus_trl = f", {data['step_time_ratio_trl_over_tlt']:.2f}x faster per step than TRL" if trl else ""
    print(
        f"TLT vs SD off: step {ratio['step']:.2f}x, rollout {ratio['rollout']:.2f}x, tail {ratio['tail']:.2f}x{versus_trl}; "
        f"reward parity with SD off: p={data['parity_tlt_vs_off']['wilcoxon_p']:.2f}; {path}"
    )


if __name__ == "__main__":
    typer.run(main)
