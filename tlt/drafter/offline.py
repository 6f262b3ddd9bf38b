"""Offline drafter training on a policy's own generations (`tlt drafter train`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, Field
from transformers import AutoModelForCausalLM

from tlt.drafter.model import EagleDrafter, PolicyParts, export_sglang_checkpoint
from tlt.drafter.slice import held_out_accept_length
from tlt.drafter.training import DrafterTrainingConfig, PolicySequence, pack, policy_features, train_drafter


class OfflineDrafterJob(BaseModel):
    """What `tlt drafter train` does: data, training, and how acceptance is measured."""

    training: DrafterTrainingConfig = DrafterTrainingConfig()
    draft_steps: int = Field(4, ge=1, le=16, description="chain length for the accept-length figure")
    eval_every: int = Field(4, ge=1, description="measure acceptance at every k-th response position")


class EpochRecord(BaseModel):
    epoch: int
    loss: float
    top1: float
    accept_length: float


def train_offline(
    policy_dir: Path,
    train_sequences: Sequence[PolicySequence],
    eval_sequences: Sequence[PolicySequence],
    job: OfflineDrafterJob,
    out: Path,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> list[EpochRecord]:
    """Train a fresh drafter epoch by epoch, measuring acceptance after each; write the SGLang
    EAGLE checkpoint and `history.json` to `out`."""
    torch.manual_seed(job.training.seed)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    parts = PolicyParts(policy)
    batches = pack(train_sequences, [policy_features(policy, s.token_ids) for s in train_sequences], job.training.tokens_per_row)
    eval_features = [policy_features(policy, s.token_ids) for s in eval_sequences]
    drafter = EagleDrafter(policy.config)
    history: list[EpochRecord] = []

    def record_epoch(epoch: int, epoch_steps: list[dict[str, float]]) -> None:
        history.append(
            EpochRecord(
                epoch=epoch,
                loss=sum(s["loss"] for s in epoch_steps) / len(epoch_steps),
                top1=sum(s["top1"] for s in epoch_steps) / len(epoch_steps),
                accept_length=held_out_accept_length(
                    drafter, parts, eval_sequences, eval_features, job.draft_steps, job.eval_every
                ),
            )
        )

    train_drafter(drafter, parts, batches, job.training, on_step, record_epoch)
    export_sglang_checkpoint(drafter, out)
    (out / "history.json").write_text(
        json.dumps({"job": job.model_dump(), "epochs": [h.model_dump() for h in history]}, indent=2) + "\n"
    )
    return history
