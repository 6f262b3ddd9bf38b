"""Rollout server (SGLang + TLT on the CPU) vs HF transformers `generate`: decode tokens/s at
batch 1, 8 and 32 on the tiny model, same prompts and greedy outputs, side by side in one run.

    python -m benchmarks.engine_vs_hf [--quick]
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import typer
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.common import RESULTS, write_json
from tlt.local.process import RolloutServerProcess
from tlt.models.hf_generate import greedy_generate
from tlt.paths import BUNDLED_MODEL
from tlt.rollout.client import SamplingParams
from tlt.rollout.evaluation import response_length
from tlt.tasks import GcdTask


def _server_tokens_per_s(server: RolloutServerProcess, prompts, batch: int, max_new_tokens: int, eos: int):
    client = server.client()
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=batch) as pool:
        outputs = list(pool.map(lambda p: client.generate(p, params).output_ids, prompts))
    seconds = time.perf_counter() - start
    return sum(response_length(o, eos) for o in outputs) / seconds, outputs


def _hf_tokens_per_s(model, prompts, batch: int, max_new_tokens: int, eos: int, pad: int):
    start = time.perf_counter()
    outputs = greedy_generate(model, prompts, max_new_tokens, eos, pad, batch_size=batch)
    seconds = time.perf_counter() - start
    return sum(response_length(o, eos) for o in outputs) / seconds, outputs


def main(
    quick: Annotated[bool, typer.Option(help="few prompts: checks the benchmark runs")] = False,
    model: Path = BUNDLED_MODEL,
    max_new_tokens: int = 600,
    seed: int = 0,
) -> None:
    batches = [1, 8, 32]
    prompts_per_batch = {1: 4, 8: 8, 32: 32} if quick else {1: 24, 8: 64, 32: 128}
    tokenizer = AutoTokenizer.from_pretrained(model)
    hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    problems = GcdTask().sample(max(prompts_per_batch.values()), seed=seed, split="test")
    all_prompts = [tokenizer(p.prompt).input_ids for p in problems]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    # One phase per engine, so that neither competes with the other for the two cores.
    engine: dict[int, tuple[float, list[list[int]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, RolloutServerProcess(model, Path(tmp) / "server.log") as server:
        _server_tokens_per_s(server, all_prompts[:4], 4, 16, eos)  # first-request overheads out of the way
        for batch in batches:
            engine[batch] = _server_tokens_per_s(server, all_prompts[: prompts_per_batch[batch]], batch, max_new_tokens, eos)
    rows = []
    for batch in batches:
        prompts = all_prompts[: prompts_per_batch[batch]]
        engine_tps, engine_out = engine[batch]
        hf_tps, hf_out = _hf_tokens_per_s(hf_model, prompts, batch, max_new_tokens, eos, pad)
        rows.append(
            {
                "batch": batch,
                "prompts": len(prompts),
                "engine_tokens_per_s": round(engine_tps, 1),
                "hf_tokens_per_s": round(hf_tps, 1),
                "speedup": round(engine_tps / hf_tps, 2),
                "outputs_identical": engine_out == hf_out,
            }
        )
        typer.echo(
            f"batch {batch:>2}: engine {engine_tps:7.0f} tok/s  HF {hf_tps:7.0f} tok/s  "
            f"x{engine_tps / hf_tps:.2f}  identical={engine_out == hf_out}"
        )

    name = "engine_vs_hf_quick" if quick else "engine_vs_hf"
    path = write_json(name, {"model": str(model.name), "max_new_tokens": max_new_tokens, "seed": seed, "rows": rows})
    _plot(rows, RESULTS / f"{name}.png")
    typer.echo(f"wrote {path}")


def _plot(rows, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["engine_tokens_per_s"] for r in rows], 0.4, label="rollout server (SGLang+TLT)")
    ax.bar([x + 0.2 for x in xs], [r["hf_tokens_per_s"] for r in rows], 0.4, label="HF transformers generate")
    for x, r in zip(xs, rows):
        ax.annotate(f"x{r['speedup']:.1f}", (x - 0.2, r["engine_tokens_per_s"]), ha="center", va="bottom")
    ax.set_xticks(list(xs), [f"batch {r['batch']}" for r in rows])
    ax.set_ylabel("generated tokens / s")
    ax.set_title("Tiny model, greedy, CPU (2 cores)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    typer.run(main)
