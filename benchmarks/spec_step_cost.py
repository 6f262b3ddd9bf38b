"""What one decode step costs on the CPU engine: a plain server against each speculative arm, at
running batch 1 to 256, with a profiler's breakdown of where the step's time goes.

Each configuration is its own server: plain decoding; TLT's adaptive worker pinned to one arm
(0 draft steps, i.e. "off", and chains of 1-4 draft steps, `--speculative-arms k`); and SGLang's
always-on worker with one tree shape. A batch is B copies of one prompt, greedy with the end of
sequence ignored, so every request takes the same steps. A step's wall time is the difference of
two runs of different lengths over the difference of their step counts (the server's own count
of verifications for speculative arms), which cancels the prefill and request overheads.

The breakdown samples SGLang's scheduler process with py-spy while a batch decodes, and files
each sample under the innermost of: TLT's CPU verification/sampling op, TLT's index/KV ops, or
the decoding stage it belongs to (drafter forwards, drafter extend, target forward/verify);
the rest is scheduler (batch preparation, result processing). TLT's attention ops are counted
within their stage and also reported on their own.

    python -m benchmarks.spec_step_cost [--quick] [--no-profile]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import psutil
import typer
from transformers import AutoTokenizer

from benchmarks.common import RESULTS, write_json
from tlt.local.process import RolloutServerProcess
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.rollout.client import RolloutClient, SamplingParams
from tlt.tasks import GcdTask

_ADAPTIVE = ["--speculative", "adaptive", "--draft-steps", "4"]
# Name -> (draft depth, flags); a step commits at most depth + 1 tokens.
CONFIGS: dict[str, tuple[int, list[str]]] = {
    "plain": (0, []),
    "arm 0 (off)": (0, [*_ADAPTIVE, "--speculative-arms", "[0]"]),
    **{f"chain {k}": (k, [*_ADAPTIVE, "--speculative-arms", f"[{k}]"]) for k in (1, 2, 3, 4)},
    "tree 3x2, 6 verified": (3, ["--speculative", "always", "--draft-steps", "3", "--draft-topk", "2", "--draft-tokens", "6"]),
}
# Innermost first: the first category whose marker is in a frame, scanning from the leaf.
_OP_CATEGORIES = [
    ("verify/sampling op", ("rollout_server/cpu/sampling.py", "verify_tree_greedy_cpu")),
    ("index/KV ops", ("rollout_server/cpu/ops.py",)),
]
# Outermost first: the decoding stage a sample belongs to.
_STAGES = [
    ("draft extend", ("EagleDraftWorker._draft_extend_for_decode (",)),
    ("draft forwards", ("EagleDraftWorker.draft (",)),
    ("target forward/verify", ("EAGLEWorkerV2.verify (", "TpModelWorker.forward_batch_generation (")),
]
_ATTENTION = "rollout_server/cpu/attention.py"
_OTHER_THREAD = "Thread._bootstrap ("  # the root frame of every thread but the main one
CATEGORIES = ["draft forwards", "draft extend", "target forward/verify", "verify/sampling op", "index/KV ops", "scheduler & other"]


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, markers in _OP_CATEGORIES:
            if any(m in frame for m in markers):
                return name
    for frame in frames:
        for name, markers in _STAGES:
            if any(m in frame for m in markers):
                return name
    return "scheduler & other"


def breakdown(collapsed: str) -> dict[str, float]:
    """Shares of the scheduler thread's samples per category (and of TLT's attention ops) from
    py-spy's collapsed stacks (`frame;frame;... count` per line). The process's other threads
    (SGLang's watchdog, tqdm's monitor) wait on condition variables, which py-spy does not
    recognise as idle: their samples are a third of the process's and are left out."""
    shares: Counter[str] = Counter()
    attention = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or stack.startswith(_OTHER_THREAD):
            continue
        frames = stack.split(";")
        shares[_category(frames)] += int(count)
        attention += int(count) * any(_ATTENTION in f for f in frames)
    total = sum(shares.values()) or 1
    out = {name: round(shares[name] / total, 3) for name in CATEGORIES}
    out["of which TLT attention ops"] = round(attention / total, 3)
    out["samples"] = total
    return out


def _scheduler_pid(server: RolloutServerProcess) -> int:
    parent = psutil.Process(server.process.pid)
    for child in parent.children(recursive=True):
        if "scheduler" in " ".join(child.cmdline()) or "scheduler" in child.name():
            return child.pid
    raise RuntimeError("no SGLang scheduler process under the server")


def _run(client: RolloutClient, prompt: list[int], batch: int, new_tokens: int) -> tuple[float, int]:
    """Wall time of one batch and its decode steps (verifications; plain: tokens after the first)."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    completions = client.generate_batch([prompt] * batch, params)
    seconds = time.perf_counter() - start
    steps = max(c.spec_verify_ct for c in completions) or new_tokens - 1  # plain: the first token is the prefill's
    return seconds, steps


def _step_seconds(client: RolloutClient, prompt: list[int], batch: int, short: int, extra: int, repeats: int) -> dict:
    """Seconds per decode step: (t(long) - t(short)) / (steps(long) - steps(short)), each the
    fastest of `repeats` interleaved runs."""
    runs: dict[int, list[tuple[float, int]]] = {short: [], short + extra: []}
    for _ in range(repeats):
        for n, measured in runs.items():
            measured.append(_run(client, prompt, batch, n))
    (t0, s0), (t1, s1) = (min(r) for r in runs.values())
    tokens = {n: round((n - 1) / max(s for _, s in r), 2) for n, r in runs.items()}
    return {"step_s": round((t1 - t0) / max(s1 - s0, 1), 5), "steps": s1 - s0, "tokens_per_step": tokens[short + extra]}


def _profile(server: RolloutServerProcess, client: RolloutClient, prompt: list[int], batch: int, new_tokens: int, out: Path) -> dict:
    """py-spy samples of the scheduler while one batch decodes (py-spy pauses it to sample whole
    stacks: the run is slower than unprofiled, its shares are what counts)."""
    raw = out.with_suffix(".txt")
    spy = subprocess.Popen(
        [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(_scheduler_pid(server)), "--rate", "200", "--format", "raw", "--output", str(raw)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attached
    worker = threading.Thread(target=_run, args=(client, prompt, batch, new_tokens))
    worker.start()
    worker.join()
    spy.send_signal(2)  # SIGINT: py-spy writes what it sampled
    spy.wait(timeout=60)
    return breakdown(raw.read_text()) if raw.exists() else {}


def _measure(name: str, depth: int, flags: list[str], prompt: list[int], batches: list[int], args: dict, profile_dir: Path | None) -> dict:
    full = [*flags, "--random-seed", "0", "--max-total-tokens", "262144"]
    if flags:
        full += ["--draft-model-path", str(BUNDLED_DRAFTER)]
    record: dict = {"config": name, "flags": full, "batches": {}, "profile": {}}
    with tempfile.TemporaryDirectory() as tmp, RolloutServerProcess(BUNDLED_MODEL, Path(tmp) / "server.log", args=full) as server:
        client = server.client()
        _run(client, prompt, 2, 16)  # first-request costs out of the way
        for batch in batches:
            cell = _step_seconds(client, prompt, batch, args["short"], args["extra_steps"] * (depth + 1), args["repeats"])
            record["batches"][str(batch)] = cell
            typer.echo(f"{name:>22} batch {batch:>3}: {cell['step_s'] * 1000:7.2f} ms/step  {cell['tokens_per_step']:.2f} tokens/step")
        if profile_dir is not None:
            for batch in args["profile_batches"]:
                share = _profile(server, client, prompt, batch, args["profile_tokens"], profile_dir / f"{re.sub(r'[^a-z0-9]+', '_', name)}_b{batch}")
                record["profile"][str(batch)] = share
                typer.echo(f"{'':>22} profile at batch {batch}: " + ", ".join(f"{k} {v:.0%}" for k, v in share.items() if k != "samples" and v))
    return record


def main(
    quick: Annotated[bool, typer.Option(help="batches 1 and 16, short runs, no tree: checks the benchmark runs")] = False,
    profile: Annotated[bool, typer.Option(help="py-spy breakdown of the step at batch 1 and 64")] = True,
    repeats: Annotated[int, typer.Option(min=1, help="runs per length; the fastest counts")] = 2,
    only: Annotated[list[str], typer.Option(help="run only these configurations (names as in the table)")] = [],  # noqa: B006
    profile_batches: Annotated[list[int], typer.Option(help="batches to profile at")] = [1, 64],  # noqa: B006
    keep_profiles: Annotated[Path | None, typer.Option(help="keep py-spy's collapsed stacks in this folder")] = None,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    prompt = tokenizer(GcdTask().sample(1, seed=0, split="test")[0].prompt).input_ids
    batches = [1, 16] if quick else [1, 4, 16, 64, 256]
    args = {
        "short": 8,
        "extra_steps": 16 if quick else 48,
        "repeats": 1 if quick else repeats,
        "profile_batches": profile_batches,
        "profile_tokens": 120 if quick else 300,
    }
    configs = {k: v for k, v in CONFIGS.items() if not (quick and k.startswith("tree")) and (not only or k in only or k == "plain")}
    with tempfile.TemporaryDirectory() as tmp:
        profile_dir = (keep_profiles or Path(tmp)) if profile else None
        if keep_profiles:
            keep_profiles.mkdir(parents=True, exist_ok=True)
        records = [_measure(name, depth, flags, prompt, batches, args, profile_dir) for name, (depth, flags) in configs.items()]
    plain = records[0]["batches"]
    for record in records:
        for batch, cell in record["batches"].items():
            cell["vs_plain_step"] = round(cell["step_s"] / plain[batch]["step_s"], 3)
    name = "spec_step_cost_quick" if quick else "spec_step_cost"
    path = write_json(name, {"batches": batches, **args, "configs": records})
    _plot(records, batches, RESULTS / f"{name}.png")
    typer.echo(_table(records, batches))
    typer.echo(f"wrote {path}")


def _table(records: list[dict], batches: list[int]) -> str:
    """Markdown: step cost relative to a plain step, per configuration and batch."""
    head = "| configuration | " + " | ".join(f"batch {b}" for b in batches) + " | tokens/step at batch 1 |"
    rows = [head, "|" + "---|" * (len(batches) + 2)]
    for r in records:
        cells = [f"{r['batches'][str(b)]['vs_plain_step']:.2f}x" for b in batches]
        first = r["batches"][str(batches[0])]
        rows.append(f"| {r['config']} | " + " | ".join(cells) + f" | {first['tokens_per_step']:.2f} |")
    plain = records[0]["batches"]
    rows.append("| (plain step, ms) | " + " | ".join(f"{plain[str(b)]['step_s'] * 1000:.1f}" for b in batches) + " | |")
    return "\n".join(rows)


def _plot(records: list[dict], batches: list[int], out: Path) -> None:
    profiled = [r for r in records if r["profile"]]
    fig, (cost, parts) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.3]})
    for r in records:
        cost.plot(batches, [r["batches"][str(b)]["vs_plain_step"] for b in batches], marker="o", label=r["config"])
    cost.set_xscale("log", base=2)
    cost.set_xlabel("running batch")
    cost.set_ylabel("step time / plain step time")
    cost.set_title("Decode step cost on the CPU engine", fontsize=9)
    cost.legend(fontsize=7)
    bottoms = None
    rows = [(f"{r['config']} @{b}", r["profile"][b]) for r in profiled for b in r["profile"]]
    for category in CATEGORIES:
        shares = [share.get(category, 0.0) for _, share in rows]
        parts.barh(range(len(rows)), shares, left=bottoms, label=category)
        bottoms = shares if bottoms is None else [a + b for a, b in zip(bottoms, shares)]
    labels = [label for label, _ in rows]
    parts.set_yticks(range(len(rows)), labels, fontsize=7)
    parts.set_xlabel("share of the scheduler's busy samples (py-spy)")
    parts.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    typer.run(main)
