"""Resumable checkpoints of a job: `step-{N}/` holds the policy (HF format, safetensors), the
model and optimizer state sharded by torch.distributed.checkpoint (`trainer_state_dcp/`: written by
every rank, read back at any number of ranks), the RNG (`trainer_state.pt`, read back with
`weights_only=True`: tensors and plain containers only) and `state.json` (the next step, policy
version, drafter version). A checkpoint is written aside and renamed into place, so a crash never
leaves a half-written one behind. Checkpoints of earlier releases kept the optimizer state in
`trainer_state.pt`; a single process still resumes them."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.distributed import DCP_DIR, full_state_dict, load_sharded, save_sharded

STATE_FILE = "state.json"
TENSORS_FILE = "trainer_state.pt"


@dataclass
class CheckpointState:
    next_step: int  # the first step a resumed job runs
    policy_version: int
    drafter_version: int = 0


def save_checkpoint(
    root: Path,
    state: CheckpointState,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    keep: int = 2,
    sharded: bool = False,
) -> Path:
    """Write `root/step-{next_step}` and keep only the newest `keep` checkpoints; returns its path.
    `sharded`: every rank of the trainer group calls it (`root` is the same shared directory)."""
    main = not sharded or dist.get_rank() == 0
    final = root / f"step-{state.next_step}"
    staging = root / f".step-{state.next_step}.partial"
    if main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
    if sharded:
        dist.barrier()
    save_sharded(staging, policy, optimizer)
    weights = full_state_dict(policy) if sharded else None
    if main:
        policy.save_pretrained(staging, state_dict=weights, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        torch.save({"torch_rng": torch.get_rng_state()}, staging / TENSORS_FILE)
        (staging / STATE_FILE).write_text(json.dumps(asdict(state)) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        for old in sorted(checkpoints(root), key=_step_of)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    if sharded:
        dist.barrier()  # no rank goes on before the checkpoint is in place
    return final


def checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under `root` (staging directories excluded)."""
    if not root.is_dir():
        return []
    return [p for p in root.glob("step-*") if (p / STATE_FILE).exists() and (p / TENSORS_FILE).exists()]


def latest_checkpoint(root: Path, at_most: int | None = None) -> Path | None:
    """The newest complete checkpoint, or the newest whose next step is at most `at_most`."""
    found = [p for p in checkpoints(root) if at_most is None or _step_of(p) <= at_most]
    return max(found, key=_step_of) if found else None


def read_state(path: Path) -> CheckpointState:
    return CheckpointState(**json.loads((path / STATE_FILE).read_text()))


def restore_training_state(path: Path, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool = False) -> None:
    """Load the model and optimizer state and the torch RNG of a checkpoint into this rank's
    (possibly sharded) policy and optimizer."""
    saved = torch.load(path / TENSORS_FILE, weights_only=True)
    if (path / DCP_DIR).is_dir():
        load_sharded(path, policy, optimizer)
    elif sharded:
        raise ValueError(f"{path} was written by an earlier single-process trainer: resume it with one rank")
    else:
        optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch_rng"])


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix("step-"))
