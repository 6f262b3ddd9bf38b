"""The `tlt` command line."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from tlt.paths import BUNDLED_MODEL
from tlt.stats import RolloutSummary

app = typer.Typer(help="TLT: fast RL rollouts with adaptive speculative decoding.", no_args_is_help=True)
console = Console()


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def _summary_table(title: str, summary: RolloutSummary) -> Table:
    table = Table(title=title)
    for column in ("responses", "accuracy", "p50", "p90", "p99", "max", "p99/p50"):
        table.add_column(column, justify="right")
    table.add_row(
        str(summary.count),
        f"{summary.accuracy:.1%}",
        f"{summary.p50:.0f}",
        f"{summary.p90:.0f}",
        f"{summary.p99:.0f}",
        str(summary.max),
        f"{summary.tail_ratio:.1f}x",
    )
    return table


@app.command("make-tiny-model")
def make_tiny_model(
    out: Annotated[Path, typer.Option(help="output directory")] = BUNDLED_MODEL,
    steps: Annotated[int | None, typer.Option(min=1, help="optimiser steps [default: the recipe's, 500]")] = None,
    seed: Annotated[int, typer.Option(help="seed of data and initialisation")] = 0,
    eval_problems: Annotated[int, typer.Option(min=0, help="test problems to score afterwards (0: skip)")] = 500,
) -> None:
    """Pretrain the tiny reasoning model (Qwen2 architecture) on worked solutions; save in HF format."""
    from tlt.models.tiny import TinyModelSpec, pretrain, save_model

    spec = TinyModelSpec(seed=seed) if steps is None else TinyModelSpec(steps=steps, seed=seed)
    with _progress() as progress:
        task = progress.add_task("pretraining", total=spec.steps, info="")
        model, tokenizer = pretrain(
            spec, lambda step, loss: progress.update(task, completed=step, info=f"loss {loss:.3f}")
        )
    save_model(model, tokenizer, spec, out)
    console.print(f"saved to {out}")
    if eval_problems:
        model_stats(model=out, problems=eval_problems)


@app.command("model-stats")
def model_stats(
    model: Annotated[Path, typer.Option(help="HF checkpoint directory")] = BUNDLED_MODEL,
    problems: Annotated[int, typer.Option(min=1, help="test problems to score")] = 500,
    seed: Annotated[int, typer.Option(help="seed of the problem draw")] = 1,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="the tiny model's context is 1024 tokens")] = 1000,
) -> None:
    """Greedy accuracy and response-length distribution of a model on held-out problems (HF transformers)."""
    from tlt.evaluation import evaluate_with_hf
    from tlt.models.tiny import TinyModelSpec

    spec_path = model / "tlt_spec.json"
    spec = TinyModelSpec.model_validate_json(spec_path.read_text()) if spec_path.exists() else TinyModelSpec()
    test = spec.task().sample(problems, seed=seed, split="test")
    with _progress() as progress:
        task = progress.add_task("generating", total=len(test), info="greedy, HF transformers")
        summary, _ = evaluate_with_hf(model, test, max_new_tokens, lambda n: progress.advance(task, n))
    console.print(_summary_table(f"{model.name}: greedy on {len(test)} test problems (lengths in tokens)", summary))


@app.command("run")
def run(
    model: Annotated[Path, typer.Option(help="HF checkpoint; the bundled tiny model is built if missing")] = BUNDLED_MODEL,
    prompts: Annotated[int, typer.Option(min=1, max=4096, help="problems in the batch")] = 64,
    samples: Annotated[int, typer.Option(min=1, max=64, help="samples per problem (the GRPO group)")] = 8,
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=32768, help="the tiny model's context is 1024 tokens")] = 1000,
    seed: Annotated[int, typer.Option()] = 0,
    runs_dir: Annotated[Path, typer.Option(help="where run records are written")] = Path("runs"),
) -> None:
    """Start a rollout server on the model and roll out a batch of problems (the RL loop's rollout phase)."""
    from transformers import AutoTokenizer

    from tlt.evaluation import rollout_with_server
    from tlt.models.tiny import TinyModelSpec
    from tlt.rollout_client import SamplingParams
    from tlt.server_process import RolloutServerProcess

    if not (model / "config.json").exists():
        if model != BUNDLED_MODEL:
            raise typer.BadParameter(f"{model} has no config.json", param_hint="--model")
        console.print("bundled tiny model missing: building it")
        make_tiny_model(out=model, eval_problems=0)
    run_dir = runs_dir / f"rollout-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = model / "tlt_spec.json"
    spec = TinyModelSpec.model_validate_json(spec_path.read_text()) if spec_path.exists() else TinyModelSpec()
    problems = spec.task().sample(prompts, seed=seed, split="test")
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    tokenizer = AutoTokenizer.from_pretrained(model)

    with console.status("starting the rollout server (SGLang + TLT plugin)"):
        server = RolloutServerProcess(model, run_dir / "rollout_server.log", args=["--random-seed", str(seed)])
        server.start()
    try:
        started = time.monotonic()
        with _progress() as progress:
            task = progress.add_task("rollout", total=prompts * samples, info="")
            done_tokens = [0]

            def on_done(rollout) -> None:
                done_tokens[0] += rollout.length
                rate = done_tokens[0] / max(1e-9, time.monotonic() - started)
                progress.update(task, advance=1, info=f"{rate:.0f} tok/s")

            summary, rollouts = rollout_with_server(
                server.client(), tokenizer, problems, samples, params, on_done=on_done
            )
        elapsed = time.monotonic() - started
    finally:
        server.stop()

    with (run_dir / "rollouts.jsonl").open("w") as out:
        for rollout in rollouts:
            out.write(rollout.model_dump_json() + "\n")
    record = {"summary": summary.model_dump(), "seconds": elapsed, "tokens_per_s": sum(r.length for r in rollouts) / elapsed}
    (run_dir / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    console.print(_summary_table(f"{prompts} problems x {samples} samples, T={temperature} (lengths in tokens)", summary))
    console.print(f"{elapsed:.1f}s, {record['tokens_per_s']:.0f} tok/s; records in {run_dir}")


if __name__ == "__main__":
    app()
