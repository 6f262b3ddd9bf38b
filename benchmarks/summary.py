"""One table of every benchmark's headline figures, from the JSON files the benchmarks wrote.

    python -m benchmarks.summary [--quick]

Writes `results/summary.md` and puts the same table into the README between its
`<!-- bench-summary -->` markers (`--quick`: `results/summary_quick.md` only, README untouched).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks.common import RESULTS

README = Path(__file__).parent.parent / "README.md"
START, END = "<!-- bench-summary:start -->", "<!-- bench-summary:end -->"


def _load(name: str, quick: bool) -> dict[str, Any] | None:
    path = RESULTS / f"{name}{'_quick' if quick else ''}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _spread(values: list[float], unit: str = " s") -> str:
    """`mean unit (each repetition)`, or the one value of a single run."""
    mean = statistics.fmean(values)
    return f"{mean:.2f}{unit}" + (f" ({', '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else "")


def _rl_rows(data: dict) -> list[tuple[str, str, str]]:
    arms = data["arms"]
    off, tlt = arms["SD off"], arms["TLT"]
    reps = f"ratio of means over {data['reps']} interleaved runs, each run's in brackets" if data["reps"] > 1 else "one run"
    rows = []
    for name, arm in arms.items():
        phases = " / ".join(f"{arm[k]:.2f}" for k in ("mean_rollout_s", "mean_tail_s", "mean_train_s", "mean_publish_s"))
        rows.append((
            f"RL step, {name}: {arm['runs_what']}",
            f"{_spread(arm['mean_step_s_reps'])}; rollout / tail / update / publish {phases} s",
            f"{off['mean_step_s'] / arm['mean_step_s']:.2f}x SD off's",
        ))  # fmt: skip
    ratio = data["tlt_over_off"]
    rows.append((f"RL step, TLT vs SD off ({reps})", f"step {_spread(ratio['step_reps'], 'x')}, rollout {_spread(ratio['rollout_reps'], 'x')}, tail {_spread(ratio['tail_reps'], 'x')}", f"**{ratio['step']:.2f}x** (rollout {ratio['rollout']:.2f}x)"))
    for name, part in data["contributions"].items():
        rows.append((f"contribution of {name}", f"step {_spread(part['step_reps'], 'x')}, rollout {_spread(part['rollout_reps'], 'x')}", f"{part['step']:.2f}x"))
    rows.append(("rollout tokens per second, TLT vs SD off", f"{tlt['rollout_tokens_per_s']:,.0f} vs {off['rollout_tokens_per_s']:,.0f}", f"{data['rollout_rate_ratio_tlt_over_off']:.2f}x"))
    halves = [f"TLT {tlt['reward_first_half']:.3f} -> {tlt['reward_second_half']:.3f}", f"SD off {off['reward_first_half']:.3f} -> {off['reward_second_half']:.3f}"]
    if "trl" in data:
        trl = data["trl"]
        rows.append((f"RL step, TLT vs TRL `GRPOTrainer` ({trl['runs_what']}; {trl['reps']} run(s))", f"{tlt['mean_step_s']:.2f} s vs {_spread(trl['mean_step_s_reps'])}", f"**{data['step_time_ratio_trl_over_tlt']:.2f}x**"))
        halves.append(f"TRL {trl['reward_first_half']:.3f} -> {trl['reward_second_half']:.3f}")
    rows.append((f"training reward, first -> second half of {len(tlt['rewards'])} steps", "; ".join(halves), ""))
    for key, label in (("parity_tlt_vs_off", "SD off"), ("parity_tlt_vs_trl", "TRL")):
        if key in data:
            p = data[key]
            verdict = "equivalent" if p["equivalent"] else "not shown equivalent"
            rows.append((
                f"learning parity, TLT vs {label} (paired by step)",
                f"mean reward difference {p['mean_difference']:+.3f}, 95% CI [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]",
                f"Wilcoxon p={p['wilcoxon_p']:.2f}; {verdict} within +-{p['equivalent_within']}",
            ))  # fmt: skip
    versions: dict[int, list[float]] = defaultdict(list)
    for step in tlt["runs"][0]["steps"]:
        if step["spec_accept_length"] > 0:
            versions[step["drafter_version"]].append(step["spec_accept_length"])
    accept = ", ".join(f"v{v}: {statistics.fmean(a):.2f} ({len(a)} steps)" for v, a in sorted(versions.items()))
    rows.append(("accept length per drafter version in TLT's first run", accept or "none", ""))
    return rows


def _rollout_rows(data: dict) -> list[tuple[str, str, str]]:
    rows = []
    for scenario in data["scenarios"]:
        modes = {m["mode"]: m for m in scenario["modes"]}
        none, always, adaptive = modes["no SD"], modes["always-on SD"], modes["adaptive SD"]
        rows.append((
            f"long-tail rollout, KV cache {scenario['kv_tokens'] // 1024}k: no SD / always-on / adaptive makespan",
            f"{none['makespan_s']:.1f} / {always['makespan_s']:.1f} / {adaptive['makespan_s']:.1f} s",
            f"always {always['speedup_vs_no_sd']:.2f}x, **adaptive {adaptive['speedup_vs_no_sd']:.2f}x**",
        ))  # fmt: skip
    return rows


def _engine_rows(data: dict) -> list[tuple[str, str, str]]:
    cells = [f"batch {r['batch']}: {r['engine_tokens_per_s']:,.0f} vs {r['hf_tokens_per_s']:,.0f}" for r in data["rows"]]
    ratios = ", ".join(f"{r['speedup']:.2f}x" for r in data["rows"])
    return [("rollout server vs transformers `generate`, tok/s", "; ".join(cells), ratios)]


def _spot_rows(data: dict) -> list[tuple[str, str, str]]:
    latencies = data["preempt_latency_s"]
    latency = f"median {statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms" if latencies else "no preemption"
    committed = [s for s in data["slices"] if s["version"]]
    accept = ", ".join(f"v{s['version']}: {s['accept_length_before']:.2f} -> {s['accept_length']:.2f}" for s in committed)
    return [
        ("spot training: preemption latency", latency, ""),
        ("spot training: idle seconds used / cost to the rollout makespan", f"{data['idle_seconds_used']:.0f} s", f"{data['makespan_cost']:+.1%}"),
        ("spot training: held-out accept length of committed drafter versions", accept or "none committed", ""),
    ]


def _adaptation_rows(data: dict) -> list[tuple[str, str, str]]:
    first, last = data["fresh_accept_first_to_last"]
    frozen_first, frozen_last = data["fresh_frozen_accept_first_to_last"]
    arms = data["arms"]
    return [
        (
            "drafter adaptation: fresh drafter, tokens per verification, step 0 -> last 5 steps",
            (
                f"spot training {first:.2f} -> {last:.2f} (versions {arms['fresh drafter, spot training']['drafter_versions']}); "
                f"frozen {frozen_first:.2f} -> {frozen_last:.2f}"
            ),
            f"step time frozen / spot training {data['fresh_step_ratio_frozen_over_spot']:.2f}x",
        ),
        ("drafter adaptation: spot workers' cost per RL step (bundled drafter)", "", f"{data['spot_cost_bundled']:+.1%}"),
    ]


BENCHMARKS = {
    "rl_step": _rl_rows,
    "long_tail_rollout": _rollout_rows,
    "engine_vs_hf": _engine_rows,
    "spot_training": _spot_rows,
    "drafter_adaptation": _adaptation_rows,
}


def summary_table(quick: bool = False) -> str:
    """The markdown table of every benchmark result present (quick or full runs)."""
    lines = ["| benchmark | measured | ratio |", "|---|---|---|"]
    machine = None
    for name, rows_of in BENCHMARKS.items():
        data = _load(name, quick)
        if data is None:
            lines.append(f"| `{name}` | not run | |")
            continue
        machine = machine or data["environment"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in rows_of(data)]
    if machine is not None:
        versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
        lines.append("")
        lines.append(f"Machine: {machine['cpu_cores']} CPU cores, {machine['memory_gib']} GiB, no GPU; {versions}; python {machine['python']}.")
    return "\n".join(lines) + "\n"


def embed(readme: Path, table: str) -> None:
    """Replace what sits between the README's summary markers."""
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme} has no {START} ... {END} block")
    readme.write_text(re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{table}{END}", text, flags=re.DOTALL))


def main(quick: Annotated[bool, typer.Option(help="summarise the --quick runs; leave the README alone")] = False) -> None:
    table = summary_table(quick)
    out = RESULTS / f"summary{'_quick' if quick else ''}.md"
    out.write_text(table)
    if not quick:
        embed(README, table)
    print(table)


if __name__ == "__main__":
    typer.run(main)
