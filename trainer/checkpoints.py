"""Resumable checkpoints of a job: `step-{N}/` holds the policy (HF format, safetensors), the
optimizer state and RNG (`trainer_state.pt`, read back with `weights_only=True`: tensors and plain
containers only) and `state.json` (the next step, policy version, drafter version). A checkpoint is
written aside and renamed into place, so a crash never leaves a half-written one behind."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

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
) -> Path:
    """Write `root/step-{next_step}` and keep only the newest `keep` checkpoints; returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state.next_step}"
    staging = root / f".step-{state.next_step}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    policy.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    torch.save({"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()}, staging / TENSORS_FILE)
    (staging / STATE_FILE).write_text(json.dumps(asdict(state)) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    for old in sorted(checkpoints(root), key=_step_of)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
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


def restore_training_state(path: Path, optimizer: torch.optim.Optimizer) -> None:
    """Load the optimizer state and the torch RNG of a checkpoint (the policy loads from `path` itself)."""
    saved = torch.load(path / TENSORS_FILE, weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch_rng"])


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix("step-"))
