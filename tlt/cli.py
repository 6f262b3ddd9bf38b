"""The `tlt` command line."""

from __future__ import annotations

import json
import signal
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

from tlt.jobs.client import JobClient
from tlt.jobs.records import JobEvent, StepMetrics
from tlt.jobs.spec import JobSpec
from tlt.local.cluster import CONNECTION_FILE, DEFAULT_HISTORY_ARMS, read_connection
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_JOB, BUNDLED_MODEL
from tlt.rollout.stats import RolloutSummary, tail_time_share
from tlt.settings.common import PolicyChannel, Speculation

app = typer.Typer(help="TLT: fast RL rollouts with adaptive speculative decoding.", no_args_is_help=True)
drafter_app = typer.Typer(help="The EAGLE drafter.", no_args_is_help=True)
app.add_typer(drafter_app, name="drafter")
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


def _build_bundled_model() -> None:
    console.print("bundled tiny model missing: building it")
    make_tiny_model(out=BUNDLED_MODEL, eval_problems=0)


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
    from tlt.models.tiny import TinyModelSpec
    from tlt.rollout.evaluation import evaluate_with_hf

    spec = TinyModelSpec.of_checkpoint(model)
    test = spec.task().sample(problems, seed=seed, split="test")
    with _progress() as progress:
        task = progress.add_task("generating", total=len(test), info="greedy, HF transformers")
        summary, _ = evaluate_with_hf(model, test, max_new_tokens, lambda n: progress.advance(task, n))
    console.print(_summary_table(f"{model.name}: greedy on {len(test)} test problems (lengths in tokens)", summary))


@app.command("rollout")
def rollout(
    model: Annotated[Path, typer.Option(help="HF checkpoint; the bundled tiny model is built if missing")] = BUNDLED_MODEL,
    prompts: Annotated[int, typer.Option(min=1, max=4096, help="problems in the batch")] = 64,
    samples: Annotated[int, typer.Option(min=1, max=64, help="samples per problem (the GRPO group)")] = 8,
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=32768, help="the tiny model's context is 1024 tokens")] = 1000,
    seed: Annotated[int, typer.Option()] = 0,
    speculative: Annotated[
        Speculation, typer.Option(help="EAGLE speculative decoding: off, always, or adaptive (TLT's bandit)")
    ] = "adaptive",
    drafter: Annotated[Path, typer.Option(help="EAGLE drafter of the model (SGLang checkpoint)")] = BUNDLED_DRAFTER,
    runs_dir: Annotated[Path, typer.Option(help="where run records are written")] = Path("runs"),
) -> None:
    """Start a rollout server on the model and roll out a batch of problems (an RL step's rollout phase alone)."""
    from transformers import AutoTokenizer

    from tlt.local.process import RolloutServerProcess
    from tlt.models.tiny import TinyModelSpec
    from tlt.rollout.client import SamplingParams
    from tlt.rollout.evaluation import rollout_with_server

    if not (model / "config.json").exists():
        if model != BUNDLED_MODEL:
            raise typer.BadParameter(f"{model} has no config.json", param_hint="--model")
        _build_bundled_model()
    if speculative != "off" and drafter == BUNDLED_DRAFTER and model != BUNDLED_MODEL:
        raise typer.BadParameter("the bundled drafter fits the bundled model only: pass --drafter or --speculative off")
    server_args = ["--random-seed", str(seed), "--speculative", speculative]
    if speculative != "off":
        server_args += ["--draft-model-path", str(drafter)]
    run_dir = runs_dir / f"rollout-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = TinyModelSpec.of_checkpoint(model)
    problems = spec.task().sample(prompts, seed=seed, split="test")
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    tokenizer = AutoTokenizer.from_pretrained(model)

    with console.status("starting the rollout server (SGLang + TLT plugin)"):
        server = RolloutServerProcess(model, run_dir / "rollout_server.log", args=server_args)
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
    tail_share = tail_time_share([r.finished_s for r in rollouts if r.finished_s is not None])
    verifications = sum(r.spec_verify_ct for r in rollouts)
    record = {
        "summary": summary.model_dump(),
        "seconds": elapsed,
        "tokens_per_s": sum(r.length for r in rollouts) / elapsed,
        "tail_time_share": tail_share,
        "speculative": speculative,
        "spec_verifications": verifications,
        "spec_accept_length": (sum(r.spec_accepted_drafts for r in rollouts) + verifications) / verifications
        if verifications
        else None,
    }
    (run_dir / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    console.print(_summary_table(f"{prompts} problems x {samples} samples, T={temperature} (lengths in tokens)", summary))
    console.print(
        f"{elapsed:.1f}s, {record['tokens_per_s']:.0f} tok/s; the last 10% of responses took "
        f"{tail_share:.0%} of the time (the long tail); records in {run_dir}"
    )
    if verifications:
        console.print(
            f"speculative decoding ({speculative}): {verifications} verification steps, "
            f"{record['spec_accept_length']:.2f} tokens committed per step on average"
        )


def _history_arms(text: str | None, speculative: Speculation) -> tuple[int, ...]:
    """`--history-arms` checked here, before any process starts (the servers would refuse it later);
    unset: DEFAULT_HISTORY_ARMS with adaptive speculation, none otherwise."""
    if text is None:
        return DEFAULT_HISTORY_ARMS if speculative == "adaptive" else ()
    try:
        arms = json.loads(text)
    except json.JSONDecodeError as error:
        raise typer.BadParameter(f"--history-arms must be a JSON list of integers: {error}") from error
    if not isinstance(arms, list) or not all(isinstance(a, int) and 1 <= a <= 16 for a in arms) or len(set(arms)) != len(arms):
        raise typer.BadParameter(f"--history-arms must be distinct draft lengths in 1..16, got {text}")
    if arms and speculative != "adaptive":
        raise typer.BadParameter("--history-arms needs --speculative adaptive")
    return tuple(arms)


def _load_job(job_file: Path, **overrides) -> JobSpec:
    from pydantic import ValidationError

    from tlt.rpc.service import validation_problems

    try:
        spec = JobSpec.from_yaml(job_file)
        return JobSpec.model_validate({**spec.model_dump(), **{k: v for k, v in overrides.items() if v is not None}})
    except (OSError, ValueError) as err:  # ValidationError included
        detail = validation_problems(err) if isinstance(err, ValidationError) else str(err)
        raise typer.BadParameter(f"{job_file}: {detail}", param_hint="JOB_FILE") from None


def _step_info(metrics: StepMetrics) -> str:
    info = f"reward {metrics.reward_mean:.3f}, {metrics.step_s:.0f} s/step"
    if metrics.eval_accuracy >= 0:
        info += f", held-out {metrics.eval_accuracy:.3f}"
    if metrics.spec_accept_length:
        info += f", SD {metrics.speculated_fraction:.0%} of tokens at {metrics.spec_accept_length:.2f}/verification"
    return info


class _JobProgress:
    """A progress bar over a job's steps, fed its events."""

    def __init__(self, progress: Progress, job_id: str, steps: int) -> None:
        self.progress = progress
        self.task = progress.add_task(job_id, total=steps, info="")

    def __call__(self, event: JobEvent) -> None:
        if event.step is not None:
            self.progress.update(self.task, completed=event.step.step + 1, info=_step_info(event.step))
        else:
            self.progress.update(self.task, completed=event.steps_done, info=f"{event.state.lower()}: {event.message}")


def _follow(client: JobClient, job_id: str) -> list[JobEvent]:
    """Show a job's events as a progress bar until it ends; returns them."""
    job = client.get(job_id)
    events: list[JobEvent] = []
    with _progress() as progress:
        show = _JobProgress(progress, job_id, job.spec.steps)
        for event in client.watch(job_id):
            events.append(event)
            show(event)
    return events


@app.command("run")
def run(
    job_file: Annotated[Path, typer.Argument(help="job YAML (a JobSpec); default: the bundled GRPO job on the tiny model")] = BUNDLED_JOB,
    steps: Annotated[int | None, typer.Option(min=1, help="override the job's number of RL steps")] = None,
    servers: Annotated[int, typer.Option(min=1, max=16, help="rollout server processes")] = 2,
    speculative: Annotated[Speculation, typer.Option(help="the servers' speculative decoding: off, always, adaptive")] = "adaptive",
    history_arms: Annotated[
        str | None,
        typer.Option(
            help="adaptive only: JSON list of history-draft lengths the bandit may pick beside EAGLE's; "
            f"default {list(DEFAULT_HISTORY_ARMS)} with --speculative adaptive, '[]' for EAGLE arms only",
            show_default=False,
        ),
    ] = None,
    spot_training: Annotated[bool, typer.Option(help="spot workers retrain the drafter on idle servers")] = True,
    redis_url: Annotated[str | None, typer.Option(envvar="TLT_REDIS_URL", help="external Redis; default: an embedded one")] = None,
    runs_dir: Annotated[Path, typer.Option(help="runs/<job>/ gets metrics, checkpoints, logs and the report")] = Path("runs"),
    trainer_threads: Annotated[int, typer.Option(min=1, max=256, help="torch threads of the policy update")] = 1,
    trainer_ranks: Annotated[
        int, typer.Option(min=1, max=64, help="trainer processes the policy is sharded over (FSDP2; torchrun)")
    ] = 1,
    policy_channel: Annotated[
        PolicyChannel, typer.Option(help="policy versions to the servers through a directory (disk), Redis, or a torch.distributed broadcast")
    ] = "disk",
) -> None:
    """Run an RL job on this machine: Redis, the drafter service, rollout servers with spot workers
    and the trainer as local processes; the job is submitted over gRPC and followed until it ends.
    Ctrl-C cancels the job and stops everything."""
    import os

    from tlt.local.cluster import ClusterConfig
    from tlt.local.run import run_job_locally

    spec = _load_job(job_file, steps=steps)
    if spec.model_path == BUNDLED_MODEL.resolve() and not (BUNDLED_MODEL / "config.json").exists():
        _build_bundled_model()
    job_id = f"{spec.name[:48]}-{datetime.now():%Y%m%d-%H%M%S}"
    spec = spec.model_copy(update={"name": job_id})
    config = ClusterConfig(
        servers=servers,
        speculative=speculative,
        history_arms=_history_arms(history_arms, speculative),
        spot_training=spot_training and speculative != "off",  # with SD off nothing uses the drafter
        redis_url=redis_url,
        redis_password=os.environ.get("TLT_REDIS_PASSWORD"),
        trainer_threads=trainer_threads,
        trainer_ranks=trainer_ranks,
        policy_channel=policy_channel,
    )
    with _progress() as progress:
        phase = progress.add_task("local cluster", total=None, info="")
        show = _JobProgress(progress, job_id, spec.steps)
        result = run_job_locally(spec, runs_dir, config, lambda text: progress.update(phase, info=text), show)
    console.print(
        f"{job_id}: {result.state or 'no state'} ({result.message}); processes up in {result.startup_s:.0f} s, "
        f"job {result.job_s:.0f} s"
    )
    console.print(f"records in {result.run_dir}: report.md, metrics.jsonl, events.jsonl, checkpoints/, logs/")
    if result.state != "SUCCEEDED":
        raise typer.Exit(128 + signal.Signals[result.interrupted_by].value if result.interrupted else 1)


DEFAULT_TRAINER = "127.0.0.1:50051"
Trainer = Annotated[
    str,
    typer.Option(
        envvar="TLT_TRAINER",
        help=f"host:port of the trainer's job API; default: the `tlt run` of the job (its runs/<job>/{CONNECTION_FILE}), "
        f"else {DEFAULT_TRAINER}",
    ),
]
Token = Annotated[
    str, typer.Option(envvar="TLT_TRAINER_AUTH_TOKEN", help="the trainer's bearer token; default: the local run's")
]
TlsCa = Annotated[Path | None, typer.Option(envvar="TLT_TLS_CA", help="CA file to verify the service's TLS; unset: plaintext")]
RunsDir = Annotated[Path, typer.Option(help="where `tlt run` keeps its runs (and a running one its connection file)")]


def _local_connection(runs_dir: Path, job_id: str | None) -> tuple[str, str] | None:
    """The trainer and token of a running `tlt run`: the job's own, or (no job named) the newest."""
    if job_id is not None:
        return read_connection(runs_dir / job_id)
    running = sorted(runs_dir.glob(f"*/{CONNECTION_FILE}"), key=lambda path: path.stat().st_mtime)
    return read_connection(running[-1].parent) if running else None


def _job_client(trainer: str, token: str, tls_ca: Path | None, runs_dir: Path = Path("runs"), job_id: str | None = None) -> JobClient:
    """A client of the trainer named, else of the local run's (with its token), else of the default."""
    if not trainer:
        local = _local_connection(runs_dir, job_id)
        if local is not None:
            trainer, token = local[0], token or local[1]
        else:
            trainer = DEFAULT_TRAINER
    return JobClient(trainer, token or None, tls_ca_file=tls_ca)


def _rpc_failed(err) -> typer.Exit:
    console.print(f"[red]refused or failed[/red] ({err.code().name}): {err.details()}")
    return typer.Exit(1)


@app.command("submit")
def submit(
    job_file: Annotated[Path, typer.Argument(help="job YAML (a JobSpec)")],
    trainer: Trainer = "",
    token: Token = "",
    watch: Annotated[bool, typer.Option(help="follow the job until it ends")] = False,
    tls_ca: TlsCa = None,
) -> None:
    """Submit a job to a (remote) trainer; paths in the job are the trainer's."""
    import grpc

    spec = _load_job(job_file)
    with _job_client(trainer, token, tls_ca) as client:
        try:
            job = client.submit(spec)
            console.print(f"{job.job_id}: {job.state}")
            if watch:
                _follow(client, job.job_id)
        except grpc.RpcError as err:
            raise _rpc_failed(err) from None


@app.command("watch")
def watch(
    job_id: str, trainer: Trainer = "", token: Token = "", tls_ca: TlsCa = None, runs_dir: RunsDir = Path("runs")
) -> None:
    """Follow a job's progress until it ends."""
    import grpc

    with _job_client(trainer, token, tls_ca, runs_dir, job_id) as client:
        try:
            events = _follow(client, job_id)
        except grpc.RpcError as err:
            raise _rpc_failed(err) from None
    final = next((e for e in reversed(events) if e.state), None)
    if final is not None:
        console.print(f"{job_id}: {final.state} ({final.message})")


@app.command("cancel")
def cancel(
    job_id: str, trainer: Trainer = "", token: Token = "", tls_ca: TlsCa = None, runs_dir: RunsDir = Path("runs")
) -> None:
    """Cancel a job (a running one stops at once; its rollouts are aborted on the servers)."""
    import grpc

    with _job_client(trainer, token, tls_ca, runs_dir, job_id) as client:
        try:
            job = client.cancel(job_id)
        except grpc.RpcError as err:
            raise _rpc_failed(err) from None
    console.print(f"{job.job_id}: {job.state}")


@app.command("list")
def list_jobs(
    trainer: Trainer = "",
    token: Token = "",
    state: Annotated[str, typer.Option(help="only jobs in this state (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)")] = "",
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 100,
    tls_ca: TlsCa = None,
    runs_dir: RunsDir = Path("runs"),
) -> None:
    """The trainer's jobs, newest first (default: those of the newest running `tlt run`)."""
    import grpc

    with _job_client(trainer, token, tls_ca, runs_dir) as client:
        try:
            jobs = client.list(state.upper(), limit)
        except grpc.RpcError as err:
            raise _rpc_failed(err) from None
    table = Table(title="jobs")
    for column in ("job", "state", "steps", "reward (last step)", "submitted", "message"):
        table.add_column(column)
    for job in jobs:
        reward = f"{job.last_step.reward_mean:.3f}" if job.HasField("last_step") else ""
        submitted = datetime.fromtimestamp(job.created_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(job.job_id, job.state, f"{job.steps_done}/{job.spec.steps}", reward, submitted, job.message)
    console.print(table)


@drafter_app.command("train")
def drafter_train(
    model: Annotated[Path, typer.Option(help="the policy (HF checkpoint)")] = BUNDLED_MODEL,
    out: Annotated[Path, typer.Option(help="where the SGLang EAGLE draft and history.json go")] = Path("runs/drafter"),
    problems: Annotated[int, typer.Option(min=1, max=100_000, help="training problems")] = 800,
    samples: Annotated[int, typer.Option(min=1, max=64, help="policy samples per training problem")] = 2,
    eval_problems: Annotated[int, typer.Option(min=1, max=10_000, help="held-out problems for acceptance")] = 40,
    epochs: Annotated[int, typer.Option(min=1, max=1000)] = 40,
    temperature: Annotated[float, typer.Option(min=0.0, help="sampling temperature of the training data")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=32768)] = 600,
    draft_steps: Annotated[int, typer.Option(min=1, max=16, help="chain length of the accept-length figure")] = 4,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Train an EAGLE drafter offline on the policy's own generations (rolled out by a rollout
    server); report the accept length of `draft_steps`-token chains after every epoch."""
    from transformers import AutoTokenizer

    from tlt.drafter.offline import OfflineDrafterJob, train_offline
    from tlt.drafter.training import DrafterTrainingConfig, PolicySequence
    from tlt.local.process import RolloutServerProcess
    from tlt.models.tiny import TinyModelSpec
    from tlt.rollout.client import SamplingParams
    from tlt.rollout.evaluation import rollout_with_server

    spec = TinyModelSpec.of_checkpoint(model)
    train_problems = spec.task().sample(problems, seed=seed, split="train")
    test_problems = spec.task().sample(eval_problems, seed=seed + 1, split="test")
    tokenizer = AutoTokenizer.from_pretrained(model)
    out.mkdir(parents=True, exist_ok=True)
    with console.status("starting the rollout server"):
        server = RolloutServerProcess(model, out / "rollout_server.log", args=["--random-seed", str(seed)]).start()
    try:
        with _progress() as progress:
            task = progress.add_task("policy samples", total=problems * samples + eval_problems, info="")
            _, train_rollouts = rollout_with_server(
                server.client(), tokenizer, train_problems, samples,
                SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
                on_done=lambda r: progress.advance(task),
            )
            _, eval_rollouts = rollout_with_server(
                server.client(), tokenizer, test_problems, 1,
                SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
                on_done=lambda r: progress.advance(task),
            )
    finally:
        server.stop()

    def as_sequences(rollouts) -> list[PolicySequence]:
        return [PolicySequence(r.prompt_ids + r.output_ids, len(r.prompt_ids)) for r in rollouts]

    job = OfflineDrafterJob(training=DrafterTrainingConfig(epochs=epochs, seed=seed), draft_steps=draft_steps)
    with _progress() as progress:
        task = progress.add_task("training the drafter", total=None, info="")

        def on_step(step: int, total: int, metrics: dict[str, float]) -> None:
            progress.update(task, completed=step, total=total, info=f"loss {metrics['loss']:.3f} top1 {metrics['top1']:.1%}")

        history = train_offline(model, as_sequences(train_rollouts), as_sequences(eval_rollouts), job, out, on_step)
    table = Table(title=f"drafter for {model.name}: accept length of {draft_steps}-token chains (greedy, held-out)")
    for column in ("epoch", "loss", "top-1", "accept length"):
        table.add_column(column, justify="right")
    for record in history:
        table.add_row(str(record.epoch), f"{record.loss:.3f}", f"{record.top1:.1%}", f"{record.accept_length:.2f}")
    console.print(table)
    console.print(f"SGLang EAGLE draft and history.json in {out}")


@drafter_app.command("fresh")
def drafter_fresh(
    model: Annotated[Path, typer.Option(help="the policy (HF checkpoint: its config.json)")] = BUNDLED_MODEL,
    out: Annotated[Path, typer.Option(help="where the SGLang EAGLE draft goes")] = Path("runs/fresh-drafter"),
) -> None:
    """Write an untrained drafter for the policy: the same one (seeded) that the drafter service
    registers as version 1 of a job without `drafter_path`, so a server can start from it."""
    from tlt.drafter.model import export_fresh_drafter

    if not (model / "config.json").is_file():
        console.print(f"[red]{model} has no config.json[/red]: a fresh drafter is built from the policy's config")
        raise typer.Exit(2)
    export_fresh_drafter(model, out)
    console.print(f"fresh SGLang EAGLE draft for {model.name} in {out}")


@drafter_app.command("warmup")
def drafter_warmup(
    job: Annotated[str, typer.Option(help="the job whose drafter is warmed up (registered with the service)")],
    service: Annotated[str, typer.Option(help="host:port of the drafter service")] = "127.0.0.1:50061",
    dataset: Annotated[
        str, typer.Option(help="JSONL under the service's --data-dir (token ids or prompt/response text); empty: the job's samples")
    ] = "",
    epochs: Annotated[int, typer.Option(min=0, max=1000, help="0: the service's default")] = 0,
    max_samples: Annotated[int, typer.Option(min=0, max=100_000, help="0: the service's default")] = 0,
    token: Annotated[str, typer.Option(envvar="TLT_DRAFTER_AUTH_TOKEN", help="the service's bearer token")] = "",
    tls_ca: TlsCa = None,
) -> None:
    """Warm a job's drafter up offline in the drafter service (its `Warmup` RPC), showing progress;
    Ctrl-C cancels it (the service gives the lease back and commits nothing)."""
    import grpc

    from tlt.rpc.service import bearer_metadata, client_channel
    from tlt.v1 import drafter_pb2 as pb
    from tlt.v1 import drafter_pb2_grpc

    metadata = bearer_metadata(token)
    request = pb.WarmupRequest(job_id=job, dataset_path=dataset, epochs=epochs, max_samples=max_samples)
    with client_channel(service, tls_ca) as channel, _progress() as progress:
        call = drafter_pb2_grpc.DrafterServiceStub(channel).Warmup(request, metadata=metadata)
        tasks: dict[str, int] = {}
        try:
            for event in call:
                if event.phase == "done":
                    break
                if event.phase not in tasks:
                    tasks[event.phase] = progress.add_task(event.phase, total=event.total, info="")
                info = f"loss {event.loss:.3f}" if event.phase == "training" else ""
                progress.update(tasks[event.phase], completed=event.step, total=event.total, info=info)
        except KeyboardInterrupt:
            call.cancel()
            raise typer.Exit(130) from None
        except grpc.RpcError as err:
            console.print(f"[red]warm-up refused or failed[/red] ({err.code().name}): {err.details()}")
            raise typer.Exit(1) from None
    outcome = f"committed as v{event.version}" if event.version else "not committed (no better than its base)"
    console.print(f"held-out accept length {event.accept_length_before:.2f} -> {event.accept_length:.2f}: {outcome}")


if __name__ == "__main__":
    app()
