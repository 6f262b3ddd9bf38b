"""What spot training costs the rollouts it shares a machine with, and how fast it gets out of the
way: RL-like rounds (a batch of rollouts, then an idle gap standing for the trainer's update) on
one rollout server, without and with a spot worker beside it, interleaved, same seeds.

    python -m benchmarks.spot_training [--quick]

Reports per-round batch time with and without the worker (the cost to makespan), the idle seconds
the worker used, slices committed or preempted, and the preemption latency: from sending a batch
to the slice giving its lease back.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated

import grpc
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import requests
import torch
import typer
from transformers import AutoTokenizer

from benchmarks.common import RESULTS, write_json
from rollout_server.server_features import ServerFeatures
from rollout_server.spot_worker import SliceResult, SpotWorker, SpotWorkerConfig, spot_training
from tlt.local.process import GrpcServiceProcess, RolloutServerProcess
from tlt.local.redis_server import EmbeddedRedis
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.rollout.client import server_load
from tlt.store.samples_stream import SamplesStream
from tlt.store.weight_channel import WeightChannel
from tlt.tasks import GcdTask
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc


def _round(server: RolloutServerProcess, prompts: list[list[int]], seed: int) -> tuple[float, float]:
    """Send one batch; returns (send time, seconds to finish)."""
    payload = {
        "input_ids": prompts,
        "sampling_params": {"max_new_tokens": 1000, "temperature": 1.0, "sampling_seed": seed},
    }
    sent = time.monotonic()
    requests.post(f"{server.url}/generate", json=payload, timeout=900).raise_for_status()
    return sent, time.monotonic() - sent


def main(
    quick: Annotated[bool, typer.Option(help="2 rounds of 16 prompts: checks the benchmark runs")] = False,
    rounds: int = 8,
    prompts: int = 64,
    gap_s: Annotated[float, typer.Option(help="idle seconds between batches (the trainer's update)")] = 8.0,
    seed: int = 0,
) -> None:
    torch.set_num_threads(1)  # as the spot worker runs beside a server (python -m rollout_server.spot_worker)
    if quick:
        rounds, prompts, gap_s = 2, 16, 4.0
    job = f"bench-{uuid.uuid4().hex[:6]}"
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    batches = [
        [tokenizer(p.prompt).input_ids for p in GcdTask().sample(prompts, seed=seed + r, split="train")] for r in range(rounds)
    ]
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis() as redis_server:
        env = redis_server.client_env()
        service = GrpcServiceProcess("drafter_service", Path(tmp) / "service.log", env=env)
        args = ["--speculative", "adaptive", "--draft-model-path", str(BUNDLED_DRAFTER), "--drafter-job", job]
        args += ["--samples-job", job, "--random-seed", str(seed)]
        server = RolloutServerProcess(BUNDLED_MODEL, Path(tmp) / "server.log", args=args, env=env)
        with service, server, grpc.insecure_channel(service.target) as channel:
            stub = drafter_pb2_grpc.DrafterServiceStub(channel)
            stub.RegisterDrafter(
                pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL), base_drafter_path=str(BUNDLED_DRAFTER))
            )
            client = redis_server.settings.client()
            config = SpotWorkerConfig(
                job_id=job, worker_id="bench", policy_path=str(BUNDLED_MODEL), idle_grace_s=0.5, min_new_samples=16,
                training=spot_training(epochs=4, lr=2e-4),  # fine-tuning a converged drafter
            )  # fmt: skip
            worker = SpotWorker(
                config,
                WeightChannel(client, job, "drafter"),
                SamplesStream(client, job),
                stub,
                lambda: server_load(server.url) > 0,
                features=ServerFeatures(server.url).many,
            )
            _round(server, batches[0][:8], seed)  # first-request costs and some samples out of the way
            rows, slices = [], []
            for r, batch in enumerate(batches):
                for with_worker in (False, True):
                    slices_before = len(slices)
                    runner = None
                    if with_worker:
                        worker._stop.clear()
                        runner = threading.Thread(target=worker.run_forever, kwargs={"poll_s": 0.1, "on_slice": slices.append})
                        runner.start()
                    time.sleep(gap_s)  # the idle gap: the worker (if any) trains now
                    sent, seconds = _round(server, batch, seed + r)
                    if runner is not None:
                        worker.stop()
                        runner.join()
                    ended = [s for s in slices[slices_before:] if s.ended_at >= sent]
                    rows.append(
                        {
                            "round": r,
                            "spot_worker": with_worker,
                            "batch_s": round(seconds, 3),
                            "preempt_latency_s": round(ended[0].ended_at - sent, 3) if ended and ended[0].preempted else None,
                            # of which: from the server showing the batch to the slice letting go
                            "stop_after_busy_s": round(ended[0].preempt_latency_s, 3) if ended and ended[0].preempted else None,
                        }
                    )
                    typer.echo(f"round {r} worker={with_worker}: batch {seconds:.2f} s")
    without = [row["batch_s"] for row in rows if not row["spot_worker"]]
    with_ = [row["batch_s"] for row in rows if row["spot_worker"]]
    latencies = [row["preempt_latency_s"] for row in rows if row["preempt_latency_s"] is not None]
    summary = {
        "batch_s_without_worker": round(statistics.mean(without), 3),
        "batch_s_with_worker": round(statistics.mean(with_), 3),
        "makespan_cost": round(statistics.mean(with_) / statistics.mean(without) - 1, 4),
        "preempt_latency_s": latencies,
        "slices": [_slice(s) for s in slices],
        "idle_seconds_used": round(sum(s.ended_at - s.started_at for s in slices), 2),
    }
    typer.echo(
        f"batch time without / with the spot worker: {summary['batch_s_without_worker']:.2f} / "
        f"{summary['batch_s_with_worker']:.2f} s (cost {summary['makespan_cost']:+.1%}); preemption latency "
        f"{', '.join(f'{x * 1000:.0f} ms' for x in latencies) or 'n/a'}; "
        f"{sum(s.version is not None for s in slices)} slices committed, {sum(s.preempted for s in slices)} preempted"
    )
    name = "spot_training_quick" if quick else "spot_training"
    data = {"rounds": rounds, "prompts": prompts, "gap_s": gap_s, "seed": seed, "rows": rows, **summary}
    path = write_json(name, data)
    _plot(rows, RESULTS / f"{name}.png")
    typer.echo(f"wrote {path}")


def _slice(s: SliceResult) -> dict:
    return {
        "base_version": s.base_version,
        "version": s.version,
        "preempted": s.preempted,
        "steps": s.steps,
        "seconds": round(s.ended_at - s.started_at, 3),
        "accept_length_before": round(s.accept_length_before, 3),
        "accept_length": round(s.accept_length, 3),
    }


def _plot(rows: list[dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    rounds = sorted({row["round"] for row in rows})
    for offset, flag, label in ((-0.2, False, "no spot worker"), (0.2, True, "spot worker in the idle gaps")):
        ax.bar([r + offset for r in rounds], [row["batch_s"] for row in rows if row["spot_worker"] is flag], 0.4, label=label)
    ax.set_xticks(rounds, [f"round {r}" for r in rounds])
    ax.set_ylabel("batch time (s)")
    ax.set_title("Rollout batch time beside spot training (CPU, tiny model)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    typer.run(main)
