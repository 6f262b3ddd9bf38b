"""A job's trainer over N ranks (torchrun): the policy sharded with FSDP2, sharded checkpoints with
torch.distributed.checkpoint, and what rank 0 tells the other ranks.

Rank 0 is the trainer service (job API, rollouts, scoring, publishing); ranks 1..N-1 run
`follow`, which waits for rank 0's next command and takes part in it: start a job (its spec goes
as JSON), update the policy on a step's samples (sent as tensors), gather the full weights to
publish them, save a checkpoint, end the job. Nothing that crosses ranks is pickled.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.policy_update import Sample

logger = logging.getLogger(__name__)

DCP_DIR = "trainer_state_dcp"  # a checkpoint's sharded model + optimizer state (distributed runs)


class Command(enum.IntEnum):
    STOP = 0
    START_JOB = 1
    UPDATE = 2
    GATHER = 3
    SAVE = 4
    END_JOB = 5


@dataclass(frozen=True)
class TrainerGroup:
    """This process's place among the trainer's ranks."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: str) -> TrainerGroup | None:
        """The group torchrun started this process in (RANK, WORLD_SIZE, MASTER_ADDR/PORT set), or
        None for a single process. NCCL on CUDA (one GPU per rank, LOCAL_RANK), gloo on the CPU."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return None
        if device.startswith("cuda"):
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            resolved = torch.device("cuda", local)
        else:
            resolved = torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group("nccl" if resolved.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), resolved)

    # Rank 0's side: each call is one collective that every follower joins in `follow`.

    def command(self, command: Command, payload: bytes = b"") -> None:
        """Tell the followers what comes next, with an optional payload (UTF-8 JSON or a path)."""
        header = torch.tensor([int(command), len(payload)], dtype=torch.int64)
        dist.broadcast(header, src=0)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=0)

    def receive(self) -> tuple[Command, bytes]:
        header = torch.zeros(2, dtype=torch.int64)
        dist.broadcast(header, src=0)
        payload = b""
        if int(header[1]):
            buffer = torch.zeros(int(header[1]), dtype=torch.uint8)
            dist.broadcast(buffer, src=0)
            payload = buffer.numpy().tobytes()
        return Command(int(header[0])), payload


def broadcast_samples(samples: list[Sample] | None, version: int = 0) -> tuple[list[Sample], int]:
    """Rank 0's samples (and the policy version they update) on every rank, as three tensors: per
    sample (prompt length, output length, counted), all token ids, all log-probabilities and
    advantages."""
    sizes = torch.zeros(4, dtype=torch.int64)
    if dist.get_rank() == 0:
        assert samples is not None
        header = torch.tensor([[len(s.prompt_ids), len(s.output_ids), int(s.counted)] for s in samples], dtype=torch.int64).reshape(-1, 3)
        ids = torch.tensor([t for s in samples for t in (*s.prompt_ids, *s.output_ids)], dtype=torch.int64)
        floats = torch.tensor([x for s in samples for x in (*s.logprobs, s.advantage)], dtype=torch.float64)
        sizes = torch.tensor([len(samples), len(ids), len(floats), version], dtype=torch.int64)
    dist.broadcast(sizes, src=0)
    if dist.get_rank() != 0:
        header = torch.zeros((int(sizes[0]), 3), dtype=torch.int64)
        ids = torch.zeros(int(sizes[1]), dtype=torch.int64)
        floats = torch.zeros(int(sizes[2]), dtype=torch.float64)
    for tensor in (header, ids, floats):
        if tensor.numel():
            dist.broadcast(tensor, src=0)
    if dist.get_rank() == 0:
        return samples, version
    received, at_id, at_float = [], 0, 0
    for prompt, output, counted in header.tolist():
        tokens = ids[at_id : at_id + prompt + output].tolist()
        values = floats[at_float : at_float + output + 1].tolist()
        at_id, at_float = at_id + prompt + output, at_float + output + 1
        received.append(Sample(tokens[:prompt], tokens[prompt:], values[:-1], values[-1], bool(counted)))
    return received, int(sizes[3])


def shard_policy(model: torch.nn.Module, mixed_precision: bool = False) -> torch.nn.Module:
    """FSDP2 over the default process group: each decoder layer is one unit (its parameters are
    gathered for its forward and backward only), the embeddings, final norm and head the root's.
    FSDP averages gradients over the ranks. `mixed_precision`: bf16 compute and gathers, fp32
    gradient reduction and master weights (GPUs)."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights, on rank 0's CPU (empty on the other ranks); every rank calls it."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank writes its shards of the model and optimizer state to `path/DCP_DIR`."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path / DCP_DIR))


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load `path/DCP_DIR` into this process's model and optimizer, sharded or not: a checkpoint
    of N ranks resumes at any number of ranks, a single process included (DCP reshards)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(path / DCP_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
