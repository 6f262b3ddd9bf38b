"""The report of a job run (`runs/<job>/report.md` with PNG plots): step time by phase, tail time,
reward and held-out accuracy, the servers' SD on/off timeline, accept length per drafter version."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure  # the object API: no pyplot state, no display backend

from tlt.jobs.records import JobEvent, StepMetrics
from tlt.local.sd_timeline import TimelinePoint


def _steps(events: Sequence[JobEvent]) -> list[StepMetrics]:
    return [e.step for e in events if e.step is not None]


def _baseline_accuracy(events: Sequence[JobEvent]) -> float | None:
    return next((e.eval_accuracy for e in events if e.step is None and e.eval_accuracy >= 0), None)


def _plot_step_time(steps: list[StepMetrics], path: Path) -> None:
    x = [s.step for s in steps]
    parts = {
        "rollout (first 90% of samples)": [s.rollout_s - s.tail_s for s in steps],
        "rollout tail (last 10%)": [s.tail_s for s in steps],
        "policy update": [s.train_s for s in steps],
        "publish": [s.publish_s for s in steps],
        "evaluation + other": [max(0.0, s.step_s - s.rollout_s - s.train_s - s.publish_s) for s in steps],
    }
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    bottom = [0.0] * len(steps)
    for label, values in parts.items():
        ax.bar(x, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(xlabel="step", ylabel="seconds", title="RL step time by phase")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _plot_reward(steps: list[StepMetrics], baseline: float | None, path: Path) -> None:
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    ax.plot([s.step for s in steps], [s.reward_mean for s in steps], marker="o", label="training reward (mean, this step's prompts)")
    evals = [(s.step + 1, s.eval_accuracy) for s in steps if s.eval_accuracy >= 0]
    if baseline is not None:
        evals.insert(0, (0, baseline))
    if evals:
        ax.plot(*zip(*evals, strict=True), marker="s", label="held-out accuracy (after n steps)")
    ax.set(xlabel="step", ylabel="reward / accuracy", title="Learning")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _plot_timeline(points: list[TimelinePoint], path: Path) -> None:
    servers = sorted({p.server for p in points})
    fig = Figure(figsize=(10, 1.8 * len(servers) + 0.8))
    axes = fig.subplots(len(servers), 1, sharex=True, squeeze=False)
    start = min(p.time for p in points)
    for ax, server in zip(axes[:, 0], servers, strict=True):
        mine = [p for p in points if p.server == server]
        t = [p.time - start for p in mine]
        ax.plot(t, [p.running for p in mine], color="tab:blue", lw=1, label="running requests")
        top = max(1, max(p.running for p in mine))
        ax.fill_between(t, 0, top, where=[p.sd_on for p in mine], step="post", color="tab:orange", alpha=0.3, label="SD on")
        for before, after in itertools.pairwise(mine):
            if after.drafter_version != before.drafter_version:
                ax.axvline(after.time - start, color="tab:green", ls="--", lw=1)
                ax.text(after.time - start, top, f"v{after.drafter_version}", fontsize=7, color="tab:green")
        ax.set_ylabel(f"server {server}")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the job started (dashed: drafter version swapped in)")
    fig.suptitle("Rollout servers: running requests, SD on/off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _plot_accept(steps: list[StepMetrics], path: Path) -> None:
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    for version in sorted({s.drafter_version for s in steps}):
        mine = [s for s in steps if s.drafter_version == version and s.spec_accept_length > 0]
        if mine:
            ax.scatter([s.step for s in mine], [s.spec_accept_length for s in mine], label=f"drafter v{version} (after the step)")
    ax.set(xlabel="step", ylabel="tokens per verification", title="Speculation: accept length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_report(run_dir: Path, title: str, events: Sequence[JobEvent], timeline: Sequence[TimelinePoint]) -> Path:
    """Write `report.md` and its plots into `run_dir`; returns the report's path."""
    steps = _steps(events)
    baseline = _baseline_accuracy(events)
    lines = [f"# {title}", ""]
    if not steps:
        lines.append("No step finished.")
    else:
        _plot_step_time(steps, run_dir / "step_time.png")
        _plot_reward(steps, baseline, run_dir / "reward.png")
        _plot_accept(steps, run_dir / "accept_length.png")
        total = sum(s.step_s for s in steps)
        rollout = sum(s.rollout_s for s in steps)
        tail = sum(s.tail_s for s in steps)
        evals = [s.eval_accuracy for s in steps if s.eval_accuracy >= 0]
        lines += [
            (f"- steps: {len(steps)}, {total:.0f} s in all ({total / len(steps):.1f} s per step); rollout "
            f"{rollout / total:.0%} of it, the last 10% of samples {tail / rollout:.0%} of the rollout time"),
            f"- training reward: {steps[0].reward_mean:.3f} (step {steps[0].step}) -> {steps[-1].reward_mean:.3f} (step {steps[-1].step})",
        ]
        if evals:
            before = f"{baseline:.3f} before training -> " if baseline is not None else ""
            lines.append(f"- held-out accuracy (sampled at the job's temperature): {before}{evals[-1]:.3f} after step {steps[-1].step}")
        lines += ["", "![step time](step_time.png)", "", "![reward](reward.png)", "", "![accept length](accept_length.png)", ""]
        if timeline:
            _plot_timeline(list(timeline), run_dir / "sd_timeline.png")
            lines += ["![SD timeline](sd_timeline.png)", ""]
        lines += [
            "| step | reward | held-out | rollout s | tail s | update s | publish s | step s | speculated | accept length | drafter | resent |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in steps:
            held_out = f"{s.eval_accuracy:.3f}" if s.eval_accuracy >= 0 else ""
            lines.append(
                f"| {s.step} | {s.reward_mean:.3f} | {held_out} | {s.rollout_s:.1f} | {s.tail_s:.1f} | {s.train_s:.1f} | "
                f"{s.publish_s:.2f} | {s.step_s:.1f} | {s.speculated_fraction:.0%} | {s.spec_accept_length:.2f} | "
                f"v{s.drafter_version} | {s.resent} |"
            )
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
