"""Does the drafter keep learning inside the job, and what does that cost the RL step? The bundled
job four ways, each on a fresh local cluster (`tlt run`'s processes), one after the other:

- bundled drafter, frozen (no spot workers) and with spot training: the drafter is trained
  already, so the difference in step time is what the spot workers cost;
- fresh drafter (`tiny-gcd-fresh.yaml`), frozen and with spot training: what idle-time training
  teaches a drafter that starts knowing nothing.

    python -m benchmarks.drafter_adaptation [--quick] [--steps N]

Writes per-step tokens per verification, drafter version and step time for each, the spot
workers' cost, the fresh drafter's first and last-5-step tokens per verification; JSON + PNG.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from matplotlib.figure import Figure

from benchmarks.common import RESULTS, write_json
from tlt.jobs.records import StepMetrics
from tlt.jobs.spec import JobSpec
from tlt.local.cluster import ClusterConfig
from tlt.local.run import run_job_locally
from tlt.paths import BUNDLED_FRESH_JOB, BUNDLED_JOB

ARMS = {
    "bundled drafter, frozen": (BUNDLED_JOB, False),
    "bundled drafter, spot training": (BUNDLED_JOB, True),
    "fresh drafter, frozen": (BUNDLED_FRESH_JOB, False),
    "fresh drafter, spot training": (BUNDLED_FRESH_JOB, True),
}
LAST = 5  # steps the "last" figures average over


def step_s(step: StepMetrics) -> float:
    """The RL step proper: rollout + update + publish (held-out evaluations left out)."""
    return step.rollout_s + step.train_s + step.publish_s


def arm_summary(steps: list[StepMetrics]) -> dict:
    """Mean step time and tokens per verification, first and over the last steps, versions served."""
    last = steps[-LAST:]
    return {
        "mean_step_s": statistics.fmean(step_s(s) for s in steps),
        "step_s_spread": statistics.pstdev(step_s(s) for s in steps),
        "mean_rollout_s": statistics.fmean(s.rollout_s for s in steps),
        "accept_first": steps[0].spec_accept_length,
        "accept_last": statistics.fmean(s.spec_accept_length for s in last),
        "drafter_versions": sorted({s.drafter_version for s in steps}),
        "steps": [s.model_dump() for s in steps],
    }


def comparison(arms: dict[str, dict]) -> dict:
    """The spot workers' cost (bundled arms) and what learning bought (fresh arms)."""
    bundled_frozen, bundled_spot, fresh_frozen, fresh_spot = (arms[name] for name in ARMS)
    return {
        "spot_cost_bundled": bundled_spot["mean_step_s"] / bundled_frozen["mean_step_s"] - 1,
        "fresh_step_ratio_frozen_over_spot": fresh_frozen["mean_step_s"] / fresh_spot["mean_step_s"],
        "fresh_accept_first_to_last": [fresh_spot["accept_first"], fresh_spot["accept_last"]],
        "fresh_frozen_accept_first_to_last": [fresh_frozen["accept_first"], fresh_frozen["accept_last"]],
    }


def _plot(arms: dict[str, dict], out: Path) -> None:
    fig = Figure(figsize=(11, 4))
    ax_accept, ax_step = fig.subplots(1, 2)
    for name, data in arms.items():
        steps = [StepMetrics(**s) for s in data["steps"]]
        x = [s.step for s in steps]
        ax_accept.plot(x, [s.spec_accept_length for s in steps], marker="o", ms=3, label=name)
        ax_step.plot(x, [step_s(s) for s in steps], marker="o", ms=3, label=name)
    ax_accept.set(xlabel="step", ylabel="tokens per verification", title="served drafter, per RL step")
    ax_step.set(xlabel="step", ylabel="seconds", title="RL step (rollout + update + publish)")
    for ax in (ax_accept, ax_step):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(
    quick: Annotated[bool, typer.Option(help="3 steps of 8 prompts on one server: checks the benchmark runs")] = False,
    steps: Annotated[int | None, typer.Option(min=LAST, help="RL steps per arm [default: the bundled job's]")] = None,
    servers: Annotated[int, typer.Option(min=1, max=8)] = 2,
) -> None:
    update: dict = {"steps": steps} if steps else {}
    if quick:
        update, servers = {"steps": 3, "prompts_per_step": 8, "eval_every": 0}, 1
    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, (job_file, spot)) in enumerate(ARMS.items()):
            job = JobSpec.from_yaml(job_file).model_copy(update={**update, "name": f"adaptation-{n}"})
            config = ClusterConfig(speculative="adaptive", spot_training=spot, servers=servers)
            run = run_job_locally(job, Path(tmp), config, on_phase=lambda text, m=name: print(f"[{m}] {text}", flush=True))
            if run.state != "SUCCEEDED":
                raise SystemExit(f"{name}: the job ended {run.state}: {run.message} (logs: {run.run_dir / 'logs'})")
            arms[name] = arm_summary(run.steps)
            print(f"[{name}] {arms[name]['mean_step_s']:.2f} s per step, tokens per verification "
                  f"{arms[name]['accept_first']:.2f} -> {arms[name]['accept_last']:.2f}", flush=True)  # fmt: skip
    data = {"update": update, "servers": servers, "arms": arms, **comparison(arms)}
    name = "drafter_adaptation_quick" if quick else "drafter_adaptation"
    path = write_json(name, data)
    _plot(arms, RESULTS / f"{name}.png")
    first, last = data["fresh_accept_first_to_last"]
    print(
        f"spot training costs {data['spot_cost_bundled']:+.1%} per step (bundled drafter); the fresh drafter went "
        f"{first:.2f} -> {last:.2f} tokens per verification with it, steps {data['fresh_step_ratio_frozen_over_spot']:.2f}x "
        f"faster than frozen; {path}"
    )


if __name__ == "__main__":
    typer.run(main)
