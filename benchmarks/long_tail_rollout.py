"""A long-tail rollout of the tiny task under several speculation modes, side by side in one run,
same model, drafter, prompts and machine.

Greedy workload: no SD, always-on SD and adaptive SD (TLT's bandit, EAGLE arms) over 512 distinct
problems.

RL-shaped workload (`--rl`): prompt groups (64 prompts x 8 samples at T=1, as a GRPO step sends
them) on servers that saw an earlier epoch of the same prompts; modes: no SD, adaptive with EAGLE
arms only, with history arms only, and with both. The servers stay up across the interleaved
rounds, so round r has r earlier epochs in its history (as an RL job's later steps do).

Every request of the batch is in flight at once, as an RL step sends it; the running batch then
shrinks to the few long responses. Decoding is greedy over distinct problems so that all three
modes produce the same tokens (checked) and differ only in time; the task's response lengths are
heavy-tailed by construction. A poller reads /metrics every 0.2 s for the SD on/off timeline.

    python -m benchmarks.long_tail_rollout [--quick] [--rl]
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import requests
import typer
from transformers import AutoTokenizer

from benchmarks.common import RESULTS, write_json
from tlt.local.process import RolloutServerProcess
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.rollout.client import SamplingParams
from tlt.rollout.evaluation import rollout_with_server
from tlt.rollout.stats import tail_time_share
from tlt.tasks import GcdTask

MODES = {
    "no SD": [],
    "always-on SD": ["--speculative", "always"],
    "adaptive SD": ["--speculative", "adaptive"],
}
HISTORY_ARMS = "[2, 4, 8]"
RL_MODES = {
    "no SD": [],
    "adaptive EAGLE": ["--speculative", "adaptive"],
    "adaptive history": ["--speculative", "adaptive", "--speculative-arms", "[0]", "--history-arms", HISTORY_ARMS],
    "adaptive both": ["--speculative", "adaptive", "--history-arms", HISTORY_ARMS],
}
POLL_S = 0.2
_GAUGE = re.compile(r"^(sglang:num_running_reqs|tlt_sd_draft_steps)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)


class MetricsPoller(threading.Thread):
    """Samples running requests and the chosen draft steps from /metrics until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[dict[str, float]] = []
        self._stop_event = threading.Event()
        self._start = time.monotonic()

    def run(self) -> None:
        session = requests.Session()
        while not self._stop_event.wait(POLL_S):
            try:
                text = session.get(f"{self.url}/metrics", timeout=5).text
            except requests.RequestException:
                continue
            values = {name: float(value) for name, value in _GAUGE.findall(text)}
            self.samples.append(
                {
                    "t": round(time.monotonic() - self._start, 3),
                    "running": values.get("sglang:num_running_reqs", 0.0),
                    "draft_steps": values.get("tlt_sd_draft_steps", -1.0),
                }
            )

    def stop(self) -> list[dict[str, float]]:
        self._stop_event.set()
        self.join()
        return self.samples


def _run_mode(
    name: str, args: list[str], problems, tokenizer, max_new_tokens: int, draft_steps: int, kv_tokens: int
) -> dict:
    flags = [*args, "--enable-metrics", "--random-seed", "0", "--max-total-tokens", str(kv_tokens)]
    if args:
        flags += ["--draft-model-path", str(BUNDLED_DRAFTER), "--draft-steps", str(draft_steps)]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    with tempfile.TemporaryDirectory() as tmp, RolloutServerProcess(BUNDLED_MODEL, Path(tmp) / "server.log", args=flags) as server:
        client = server.client()
        rollout_with_server(client, tokenizer, problems[:8], 1, params)  # first-request costs out of the way
        poller = MetricsPoller(server.url)
        poller.start()
        start = time.monotonic()
        summary, rollouts = rollout_with_server(client, tokenizer, problems, 1, params)
        makespan = time.monotonic() - start
        timeline = poller.stop()
    tokens = sum(r.length for r in rollouts)
    finish = sorted(r.finished_s for r in rollouts)
    typer.echo(f"{name:>13}: makespan {makespan:6.2f} s  {tokens / makespan:7.0f} tok/s  p99 length {summary.p99}")
    return {
        "mode": name,
        "flags": flags,
        "makespan_s": round(makespan, 3),
        "tokens": tokens,
        "tokens_per_s": round(tokens / makespan, 1),
        "tail_10pct_time_share": round(tail_time_share(finish, 0.9), 3),
        "lengths": {"p50": summary.p50, "p90": summary.p90, "p99": summary.p99, "max": summary.max},
        "outputs": [r.output_ids for r in rollouts],
        "finish_s": [round(t, 3) for t in finish],
        "timeline": timeline,
    }


def _scenario(batch, tokenizer, max_new_tokens: int, draft_steps: int, kv_tokens: int, repeats: int) -> dict:
    """The three modes, `repeats` rounds interleaved (so drifts of the machine hit all modes alike)."""
    typer.echo(f"KV cache of {kv_tokens} tokens:")
    rounds = [
        [_run_mode(name, args, batch, tokenizer, max_new_tokens, draft_steps, kv_tokens) for name, args in MODES.items()]
        for _ in range(repeats)
    ]
    identical = all(r["outputs"] == rounds[0][0]["outputs"] for runs in rounds for r in runs)
    # The first round's records (timeline, finish times) with the makespan averaged over rounds.
    results = rounds[0]
    for i, r in enumerate(results):
        del r["outputs"]
        r["makespans_s"] = [runs[i]["makespan_s"] for runs in rounds]
        r["makespan_s"] = round(sum(r["makespans_s"]) / len(rounds), 3)
        r["tokens_per_s"] = round(r["tokens"] / r["makespan_s"], 1)
    for r in results:
        r["speedup_vs_no_sd"] = round(results[0]["makespan_s"] / r["makespan_s"], 3)
    typer.echo("  mean makespans: " + ", ".join(f"{r['mode']} {r['makespan_s']:.2f} s" for r in results))
    typer.echo("  speedup vs no SD: " + ", ".join(f"{r['mode']} x{r['speedup_vs_no_sd']:.2f}" for r in results))
    typer.echo(f"  outputs identical across modes: {identical}")
    return {"kv_tokens": kv_tokens, "outputs_identical": identical, "modes": results}


def main(
    quick: Annotated[bool, typer.Option(help="32 problems, one round: checks the benchmark runs")] = False,
    problems: int = 512,
    max_new_tokens: int = 1000,
    draft_steps: int = 4,
    kv_tokens: Annotated[
        list[int],
        typer.Option(help="KV cache sizes to run: TLT's CPU default, and room for the whole batch as on a GPU"),
    ] = [65536, 262144],  # noqa: B006 (typer reads the default)
    repeats: Annotated[int, typer.Option(min=1, help="rounds over the modes; figures are per-mode means")] = 2,
    seed: int = 0,
    rl: Annotated[bool, typer.Option(help="the RL-shaped workload (prompt groups at T=1, history arms) instead")] = False,
) -> None:
    count = 32 if quick else problems
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    if rl:
        prompts, samples, tokens = (8, 4, 128) if quick else (64, 8, 400)
        scenario = _rl_scenario(tokenizer, prompts, samples, tokens, draft_steps, 1 if quick else max(repeats, 3))
        name = "long_tail_rollout_rl_quick" if quick else "long_tail_rollout_rl"
        path = write_json(name, scenario)
        _plot_rl(scenario, RESULTS / f"{name}.png")
        typer.echo(f"wrote {path}")
        return
    batch = GcdTask().sample(count, seed=seed, split="test")
    scenarios = [
        _scenario(batch, tokenizer, max_new_tokens, draft_steps, kv, 1 if quick else repeats)
        for kv in (kv_tokens[:1] if quick else kv_tokens)
    ]
    name = "long_tail_rollout_quick" if quick else "long_tail_rollout"
    data = {"problems": count, "max_new_tokens": max_new_tokens, "draft_steps": draft_steps, "rounds": repeats, "seed": seed}
    path = write_json(name, {**data, "scenarios": scenarios})
    _plot(scenarios, RESULTS / f"{name}.png")
    typer.echo(f"wrote {path}")


def _rl_scenario(tokenizer, prompts: int, samples: int, max_new_tokens: int, draft_steps: int, repeats: int) -> dict:
    """RL_MODES on one server each, kept up: a warm-up epoch, then `repeats` epochs interleaved."""
    problems = GcdTask().sample(prompts, seed=0)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    makespans: dict[str, list[float]] = {name: [] for name in RL_MODES}
    counts: dict[str, list[float]] = {name: [] for name in RL_MODES}
    typer.echo(f"RL-shaped: {prompts} prompts x {samples} samples, T=1, {max_new_tokens} tokens at most")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = {}
        for i, (name, args) in enumerate(RL_MODES.items()):
            flags = [*args, "--random-seed", "0"]
            if args:
                flags += ["--draft-model-path", str(BUNDLED_DRAFTER), "--draft-steps", str(draft_steps)]
            servers[name] = stack.enter_context(RolloutServerProcess(BUNDLED_MODEL, Path(tmp) / f"server-{i}.log", args=flags))
        for name, server in servers.items():  # the earlier epoch every measured one can draft from
            rollout_with_server(server.client(), tokenizer, problems, samples, params)
        for round_ in range(repeats):
            for name, server in servers.items():
                start = time.monotonic()
                _, rollouts = rollout_with_server(server.client(), tokenizer, problems, samples, params)
                makespans[name].append(round(time.monotonic() - start, 3))
                verifications = sum(r.spec_verify_ct for r in rollouts)
                accepted = sum(r.spec_accepted_drafts for r in rollouts)
                counts[name].append(round((verifications + accepted) / verifications, 3) if verifications else 0.0)
                typer.echo(f"  round {round_ + 1} {name:>16}: {makespans[name][-1]:6.2f} s, "
                           f"{sum(r.length for r in rollouts)} tokens, {counts[name][-1]:.2f} tokens per speculative step")  # fmt: skip
    results = []
    for name, flags in RL_MODES.items():
        mean = sum(makespans[name]) / len(makespans[name])
        results.append({"mode": name, "flags": flags, "makespans_s": makespans[name], "makespan_s": round(mean, 3),
                        "tokens_per_speculative_step": counts[name]})  # fmt: skip
    for r in results:
        r["speedup_vs_no_sd"] = round(results[0]["makespan_s"] / r["makespan_s"], 3)
    typer.echo("  speedup vs no SD: " + ", ".join(f"{r['mode']} x{r['speedup_vs_no_sd']:.2f}" for r in results))
    return {"prompts": prompts, "samples_per_prompt": samples, "max_new_tokens": max_new_tokens, "modes": results}


def _plot(scenarios: list[dict], out: Path) -> None:
    fig, axes = plt.subplots(
        len(scenarios), 2, figsize=(11, 3.8 * len(scenarios)), gridspec_kw={"width_ratios": [1, 2]}, squeeze=False
    )
    for (bars, timeline), scenario in zip(axes, scenarios):
        _plot_scenario(bars, timeline, scenario)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def _plot_scenario(bars, timeline, scenario: dict) -> None:
    results = scenario["modes"]
    names = [r["mode"] for r in results]
    bars.bar(names, [r["makespan_s"] for r in results], color=["tab:gray", "tab:orange", "tab:green"])
    for x, r in enumerate(results):
        bars.annotate(f"{r['tokens_per_s']:.0f} tok/s\nx{r['speedup_vs_no_sd']:.2f}", (x, r["makespan_s"]), ha="center", va="bottom", fontsize=8)
    bars.set_ylabel("makespan (s)")
    bars.set_ylim(0, max(r["makespan_s"] for r in results) * 1.25)
    bars.set_title(f"Long-tail rollout, CPU, KV {scenario['kv_tokens'] // 1024}k tokens", fontsize=9)
    bars.tick_params(axis="x", labelsize=8)
    for r, color in zip(results, ["tab:gray", "tab:orange", "tab:green"]):
        ts = [s["t"] for s in r["timeline"]]
        running = [max(s["running"], 1) for s in r["timeline"]]  # log axis; 0 only after the last finished
        timeline.plot(ts, running, color=color, label=f"{r['mode']}: running requests")
    adaptive = results[-1]["timeline"]
    steps = timeline.twinx()
    steps.step([s["t"] for s in adaptive], [max(s["draft_steps"], 0) for s in adaptive], where="post", color="tab:red", alpha=0.6, label="adaptive: draft steps (0 = SD off)")
    steps.set_ylabel("draft steps chosen")
    steps.set_ylim(-0.3, max(max(s["draft_steps"], 0) for s in adaptive) + 0.5)
    timeline.set_xlabel("time since the batch was sent (s)")
    timeline.set_ylabel("running requests")
    timeline.set_yscale("log")
    lines = timeline.get_legend_handles_labels()[0] + steps.get_legend_handles_labels()[0]
    timeline.legend(lines, [line.get_label() for line in lines], fontsize=7, loc="upper right")


def _plot_rl(scenario: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    results = scenario["modes"]
    ax.bar([r["mode"] for r in results], [r["makespan_s"] for r in results], color=["tab:gray", "tab:orange", "tab:blue", "tab:green"])
    for x, r in enumerate(results):
        ax.annotate(f"x{r['speedup_vs_no_sd']:.2f}", (x, r["makespan_s"]), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("rollout makespan (s), mean of rounds")
    ax.set_title(f"RL-shaped rollout: {scenario['prompts']} prompts x {scenario['samples_per_prompt']} samples, T=1", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    typer.run(main)
