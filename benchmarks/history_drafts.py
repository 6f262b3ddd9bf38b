"""How many tokens a verification would commit with history drafts on an RL-shaped rollout of the
tiny task, per draft source, and what a lookup costs beside a plain decode step.

Two epochs of 64 prompts x 8 samples at T=1 are sampled from the bundled model on a rollout server
(no SD). Each epoch's samples are then replayed through `HistoryDrafter` in lockstep (every
response advances one verification per step, as a running batch does): a draft's accepted length
is its longest prefix equal to the realised sample, plus the bonus token. For point drafts at T=1
that is an unbiased estimate of in-engine acceptance, since a lossless verifier accepts draft token
x with probability p(x), the probability the realised sample has it.

In-engine: a rollout server whose only arm is a history chain samples two epochs of the same
prompts (the second with the first's responses in its history) and reports SGLang's own counts
(verifications, accepted drafts) and the wall time of each epoch beside a plain server's.

    python -m benchmarks.history_drafts [--quick]
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import typer
from transformers import AutoTokenizer

from benchmarks.common import RESULTS, write_json
from tlt.local.process import RolloutServerProcess
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.rollout.client import RolloutClient, SamplingParams
from tlt.rollout.evaluation import rollout_with_server
from tlt.speculation.history import HistoryConfig, HistoryDrafter
from tlt.tasks import GcdTask

Sample = tuple[Hashable, list[int], list[int]]  # (prompt group, prompt ids, output ids)

KEY_LENS = (2, 4, 6)
SOURCES = {
    "own prefix and prompt": {"siblings": False, "earlier": False, "recent": False},
    "+ live siblings": {"siblings": True, "earlier": False, "recent": False},
    "+ earlier epoch": {"siblings": True, "earlier": True, "recent": False},
    "+ recent window": {"siblings": True, "earlier": True, "recent": True},
}


def replay(samples: list[Sample], drafter: HistoryDrafter, draft_len: int, siblings: bool) -> tuple[int, int, list[float]]:
    """Run `samples` through `drafter` in lockstep; (tokens committed, verifications, seconds per step)."""
    position = {}
    for n, (group, prompt, _) in enumerate(samples):
        drafter.start(n, group if siblings else ("alone", n), prompt)
        position[n] = 0
    committed = verifications = 0
    step_s = []
    while position:
        start = time.perf_counter()
        for n, pos in list(position.items()):
            truth = samples[n][2]
            draft = drafter.propose(n, min(draft_len, len(truth) - pos - 1))
            accepted = 0
            while accepted < len(draft.tokens) and draft.tokens[accepted] == truth[pos + accepted]:
                accepted += 1
            step = truth[pos : pos + accepted + 1]  # the accepted drafts and the verifier's own token
            drafter.extend(n, step)
            committed += len(step)
            verifications += 1
            if pos + len(step) >= len(truth):
                drafter.finish(n)
                del position[n]
            else:
                position[n] = pos + len(step)
        step_s.append(time.perf_counter() - start)
    return committed, verifications, step_s


def _epoch(client: RolloutClient, tokenizer, problems, samples_per_prompt: int, max_new_tokens: int) -> list[Sample]:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    _, rollouts = rollout_with_server(client, tokenizer, problems, samples_per_prompt, params)
    return [((r.a, r.b), r.prompt_ids, r.output_ids) for r in rollouts]


def _in_engine(tokenizer, problems, samples_per_prompt: int, max_new_tokens: int, draft_len: int, log: Path) -> list[dict]:
    """Two epochs on a server with one history arm of `draft_len` tokens and, side by side, on a
    plain server (interleaved: plain, history, per epoch): SGLang's counts and wall times."""
    history_args = ["--speculative", "adaptive", "--draft-model-path", str(BUNDLED_DRAFTER)]
    history_args += ["--speculative-arms", "[]", "--history-arms", f"[{draft_len}]", "--random-seed", "0"]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    rows = []
    with (
        RolloutServerProcess(BUNDLED_MODEL, log.with_suffix(".plain.log"), args=["--random-seed", "0"]) as plain,
        RolloutServerProcess(BUNDLED_MODEL, log.with_suffix(".history.log"), args=history_args) as history,
    ):
        for epoch in (1, 2):
            row = {"epoch": epoch, "draft_len": draft_len}
            for name, server in (("plain", plain), ("history", history)):
                start = time.monotonic()
                _, rollouts = rollout_with_server(server.client(), tokenizer, problems, samples_per_prompt, params)
                row[f"{name}_s"] = round(time.monotonic() - start, 2)
            verifications = sum(r.spec_verify_ct for r in rollouts)
            row["tokens_per_verification"] = round((verifications + sum(r.spec_accepted_drafts for r in rollouts)) / verifications, 3)
            row["speedup"] = round(row["plain_s"] / row["history_s"], 3)
            typer.echo(f"  in-engine epoch {epoch}, history chain {draft_len}: {row['tokens_per_verification']:.2f} tokens per "
                       f"verification, {row['history_s']:.1f}s vs {row['plain_s']:.1f}s plain ({row['speedup']:.2f}x)")  # fmt: skip
            rows.append(row)
    return rows


def _plain_step_s(client: RolloutClient, tokenizer, problems, batch: int) -> float:
    """A plain decode step at `batch` running requests: the difference of two fixed-length batches,
    which cancels prefill and request overheads."""
    times = {}
    for tokens in (64, 192):
        params = SamplingParams(max_new_tokens=tokens, temperature=1.0, ignore_eos=True)
        start = time.monotonic()
        rollout_with_server(client, tokenizer, problems[:batch], 1, params)
        times[tokens] = time.monotonic() - start
    return (times[192] - times[64]) / 128


def main(
    quick: Annotated[bool, typer.Option(help="8 prompts x 4 samples, 128 tokens: checks the benchmark runs")] = False,
    prompts: int = 64,
    samples_per_prompt: int = 8,
    max_new_tokens: int = 400,
) -> None:
    if quick:
        prompts, samples_per_prompt, max_new_tokens = 8, 4, 128
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    problems = GcdTask().sample(prompts, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with RolloutServerProcess(BUNDLED_MODEL, log, args=["--random-seed", "0"]) as server:
            client = server.client()
            typer.echo(f"sampling two epochs of {prompts} prompts x {samples_per_prompt} at T=1 ...")
            epochs = [_epoch(client, tokenizer, problems, samples_per_prompt, max_new_tokens) for _ in range(2)]
            plain_s = _plain_step_s(client, tokenizer, GcdTask().sample(64, seed=1), 64)
        in_engine = _in_engine(tokenizer, problems, samples_per_prompt, max_new_tokens, 4, log)
    rows = []
    for key_len, draft_len in itertools.product(KEY_LENS, (2, 4, 8)):
        for name, source in SOURCES.items():
            config = HistoryConfig(key_len=key_len, recent_tokens=HistoryConfig().recent_tokens if source["recent"] else 0)
            drafter = HistoryDrafter(config)
            if source["earlier"]:
                replay(epochs[0], drafter, draft_len, siblings=True)
            committed, verifications, _ = replay(epochs[1], drafter, draft_len, source["siblings"])
            rows.append(
                {"key_len": key_len, "draft_len": draft_len, "sources": name, "tokens_per_verification": round(committed / verifications, 3)}
            )
            typer.echo(f"  key {key_len} k={draft_len} {name:>22}: {committed / verifications:.2f} tokens per verification")
    # Lookup cost at batch 64: 8 prompts' samples (64 responses) in lockstep, history of an epoch.
    batch = [s for s in epochs[1] if s[0] in {g for g, _, _ in epochs[1][: 8 * samples_per_prompt : samples_per_prompt]}][:64]
    drafter = HistoryDrafter()
    replay(epochs[0], drafter, 4, siblings=True)
    _, _, step_s = replay(batch, drafter, 4, siblings=True)
    lookup_s = statistics.median(step_s[: max(1, len(step_s) // 4)])  # while the batch is still full
    typer.echo(
        f"lookup and update for {len(batch)} requests: {lookup_s * 1e6:.0f} us per step; "
        f"plain decode step at batch 64: {plain_s * 1e3:.2f} ms ({lookup_s / plain_s:.1%})"
    )
    result = {
        "prompts": prompts,
        "samples_per_prompt": samples_per_prompt,
        "max_new_tokens": max_new_tokens,
        "mean_response_tokens": round(statistics.mean(len(s[2]) for s in epochs[1]), 1),
        "rows": rows,
        "in_engine": in_engine,
        "lookup_batch": len(batch),
        "lookup_us_per_step": round(lookup_s * 1e6, 1),
        "plain_decode_step_ms_batch_64": round(plain_s * 1e3, 3),
        "lookup_share_of_plain_step": round(lookup_s / plain_s, 4),
    }
    name = "history_drafts_quick" if quick else "history_drafts"
    path = write_json(name, result)
    _plot(rows, RESULTS / f"{name}.png")
    typer.echo(f"wrote {path}")


def _plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    lengths = sorted({r["draft_len"] for r in rows})
    key_len = HistoryConfig().key_len
    width = 0.8 / len(SOURCES)
    for i, name in enumerate(SOURCES):
        values = [
            next(r["tokens_per_verification"] for r in rows if r["draft_len"] == k and r["sources"] == name and r["key_len"] == key_len)
            for k in lengths
        ]
        ax.bar([x + i * width for x in range(len(lengths))], values, width, label=name)
    ax.set_xticks([x + width * (len(SOURCES) - 1) / 2 for x in range(len(lengths))], [f"{k} draft tokens" for k in lengths])
    ax.set_ylabel("tokens per verification")
    ax.set_title(f"History drafts on two epochs of the tiny task (T=1, keys up to {key_len} tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    typer.run(main)
