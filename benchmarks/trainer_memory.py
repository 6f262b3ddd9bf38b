"""Memory of the sharded trainer per rank: a random ~100M-parameter Qwen2 policy sharded with FSDP2
over 1, 2 and 4 ranks (gloo, CPU, torchrun), one GRPO update (`trainer.policy_update`) on made-up
samples. Per rank: the bytes its parameters, gradients and AdamW state hold after the step (their
local shards; what a GPU must keep resident between steps), and the process's peak RSS (adds the
layer weights FSDP gathers for a moment, activations, and torch itself).

    python -m benchmarks.trainer_memory [--ranks 1 --ranks 2 --ranks 4] [--quick]

Writes results/trainer_memory.json and .png (--quick: 1 and 2 ranks of a 2-layer model,
trainer_memory_quick.*)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import typer

from benchmarks.common import RESULTS, write_json

CONFIG = {  # ~100M parameters: 12 layers of 768, a 32k vocabulary, tied embeddings
    "vocab_size": 32000,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


def _local_bytes(tensors) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def _rank(out: Path, layers: int) -> None:
    """One rank's measurement (run under torchrun by `main`)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tlt.jobs.spec import JobSpec
    from trainer.distributed import TrainerGroup, shard_policy
    from trainer.policy_update import PolicyUpdate, Sample

    torch.set_num_threads(1)
    group = TrainerGroup.from_environment("cpu")
    rank, world = (group.rank, group.world_size) if group else (0, 1)
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(Qwen2Config(**{**CONFIG, "num_hidden_layers": layers})).train()
    parameters = sum(p.numel() for p in policy.parameters())
    if group is not None:
        shard_policy(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    spec = JobSpec(name="memory", tokens_per_micro_batch=512)
    generator = torch.Generator().manual_seed(1)
    samples = [
        Sample(torch.randint(0, 32000, (32,), generator=generator).tolist(), torch.randint(0, 32000, (32,), generator=generator).tolist(), [-1.0] * 32, 1.0 - 2 * (i % 2), True)
        for i in range(8 * max(world, 1))
    ]
    update = PolicyUpdate(spec, policy, optimizer, None, 0, torch.device("cpu"), rank, world)
    update(samples, version=0)
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    record = {
        "rank": rank,
        "parameters_total": parameters,
        "parameter_bytes": _local_bytes(policy.parameters()),
        "gradient_bytes": _local_bytes(p.grad for p in policy.parameters() if p.grad is not None),
        "optimizer_bytes": _local_bytes(state),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(record))


def _measure(ranks: int, layers: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TLT_TRAINER_MEMORY_OUT": tmp, "TLT_TRAINER_MEMORY_LAYERS": str(layers)}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "benchmarks.trainer_memory"]
        subprocess.run(command, env=env, check=True, capture_output=True)
        return sorted((json.loads(p.read_text()) for p in Path(tmp).glob("rank-*.json")), key=lambda r: r["rank"])


def main(
    ranks: Annotated[list[int], typer.Option(help="numbers of ranks to measure")] = [1, 2, 4],  # noqa: B006
    quick: Annotated[bool, typer.Option(help="1 and 2 ranks, 2 layers: checks the benchmark runs")] = False,
) -> None:
    layers = 2 if quick else CONFIG["num_hidden_layers"]
    ranks = [1, 2] if quick else ranks
    rows = []
    for n in ranks:
        typer.echo(f"{n} rank(s): one update of a {layers}-layer, {CONFIG['hidden_size']}-wide Qwen2 ...")
        per_rank = _measure(n, layers)
        resident = max(r["parameter_bytes"] + r["gradient_bytes"] + r["optimizer_bytes"] for r in per_rank)
        rows.append({"ranks": n, "per_rank": per_rank, "resident_bytes_max": resident, "peak_rss_bytes_max": max(r["peak_rss_bytes"] for r in per_rank)})
        typer.echo(f"  parameters + gradients + AdamW per rank: {resident / 2**20:.0f} MiB; peak RSS {rows[-1]['peak_rss_bytes_max'] / 2**20:.0f} MiB")
    base = rows[0]["resident_bytes_max"] * rows[0]["ranks"]
    for row in rows:
        row["resident_fraction_of_unsharded"] = row["resident_bytes_max"] / base
    name = "trainer_memory_quick" if quick else "trainer_memory"
    config = {**CONFIG, "num_hidden_layers": layers}
    path = write_json(name, {"config": config, "parameters": rows[0]["per_rank"][0]["parameters_total"], "rows": rows})
    _plot(rows, rows[0]["per_rank"][0]["parameters_total"], RESULTS / f"{name}.png")
    typer.echo(f"wrote {path}")


def _plot(rows: list[dict], parameters: int, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6, 4))
    ranks = [r["ranks"] for r in rows]
    axis.plot(ranks, [r["resident_bytes_max"] / 2**20 for r in rows], "o-", label="parameters + gradients + AdamW")
    axis.plot(ranks, [r["peak_rss_bytes_max"] / 2**20 for r in rows], "s--", label="peak RSS (process)")
    ideal = rows[0]["resident_bytes_max"] * rows[0]["ranks"] / 2**20
    axis.plot(ranks, [ideal / n for n in ranks], ":", color="gray", label="unsharded / N")
    axis.set_xlabel("trainer ranks")
    axis.set_ylabel("MiB per rank (largest rank)")
    axis.set_xticks(ranks)
    axis.set_title(f"FSDP2 trainer memory, {parameters / 1e6:.0f}M-parameter Qwen2")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    if "TLT_TRAINER_MEMORY_OUT" in os.environ:
        _rank(Path(os.environ["TLT_TRAINER_MEMORY_OUT"]), int(os.environ["TLT_TRAINER_MEMORY_LAYERS"]))
    else:
        typer.run(main)
