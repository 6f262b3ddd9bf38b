"""Training the EAGLE drafter on the policy's own sequences.

For a sequence x_0..x_{T-1} with policy features f_0..f_{T-1}, draft step t (0 <= t <= T-2) reads
(embed(x_{t+1}), f_t) and is trained to predict f_{t+1}: SmoothL1 on the feature plus 0.1 x the
cross-entropy between the policy's next-token distribution softmax(lm_head(f_{t+1})) and the
draft's. Only steps whose target feature predicts a response token count. Several sequences are
packed into one row with a block-diagonal causal mask and restarted positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from transformers import PreTrainedModel

from tlt.drafter.model import EagleDrafter, PolicyParts


@dataclass
class PolicySequence:
    """One sequence (prompt + response token ids) and where its response starts."""

    token_ids: list[int]
    prompt_len: int


@dataclass
class PackedBatch:
    """Draft-step inputs of several sequences packed into rows."""

    next_tokens: torch.Tensor  # (rows, width) x_{t+1}
    features: torch.Tensor  # (rows, width, H) f_t
    targets: torch.Tensor  # (rows, width, H) f_{t+1}
    position_ids: torch.Tensor  # (rows, width)
    loss_mask: torch.Tensor  # (rows, width) bool
    attention_mask: torch.Tensor  # (rows, 1, width, width) bool

    def to(self, device: torch.device) -> PackedBatch:
        """The batch on `device` (itself when it is there already)."""
        if self.next_tokens.device == device:
            return self
        return PackedBatch(**{name: getattr(self, name).to(device) for name in self.__dataclass_fields__})


class DrafterTrainingConfig(BaseModel):
    """Optimiser and batching of drafter training."""

    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    ce_weight: float = Field(0.1, ge=0, description="weight of the soft cross-entropy term")
    tokens_per_row: int = Field(2048, ge=16, description="packing width")
    rows_per_step: int = Field(4, ge=1)
    epochs: int = Field(4, ge=1)
    seed: int = 0


def mixed_precision(device: torch.device):
    """bf16 autocast on GPUs (the borrowed parts are in the serving dtype there; the drafter's own
    weights stay float32); nothing on the CPU."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def policy_features(policy: PreTrainedModel, token_ids: Sequence[int]) -> torch.Tensor:
    """The policy's last hidden states (after its final norm) for one sequence: (T, H)."""
    return policy.model(input_ids=torch.tensor([list(token_ids)])).last_hidden_state[0]


def pack(
    sequences: Sequence[PolicySequence], features: Sequence[torch.Tensor], tokens_per_row: int
) -> list[PackedBatch]:
    """Pack sequences (greedily, in order) into rows of at most `tokens_per_row` draft steps;
    one single-row `PackedBatch` per row. A sequence longer than a row is cut."""
    rows: list[list[tuple[PolicySequence, torch.Tensor]]] = [[]]
    used = 0
    for seq, feats in zip(sequences, features):
        steps = min(len(seq.token_ids) - 1, tokens_per_row)
        if steps <= 0:
            continue
        if used + steps > tokens_per_row:
            rows.append([])
            used = 0
        rows[-1].append((seq, feats))
        used += steps
    return [_pack_row(row, tokens_per_row) for row in rows if row]


def _pack_row(items: list[tuple[PolicySequence, torch.Tensor]], limit: int) -> PackedBatch:
    next_tokens, features, targets, positions, mask, segments = [], [], [], [], [], []
    for index, (seq, feats) in enumerate(items):
        steps = min(len(seq.token_ids) - 1, limit)
        ids = torch.tensor(seq.token_ids)
        next_tokens.append(ids[1 : steps + 1])
        features.append(feats[:steps])
        targets.append(feats[1 : steps + 1])
        positions.append(torch.arange(steps))
        mask.append(torch.arange(1, steps + 1) >= seq.prompt_len - 1)
        segments.append(torch.full((steps,), index))
    segment = torch.cat(segments)
    same = segment[:, None] == segment[None, :]
    causal = torch.ones(len(segment), len(segment), dtype=torch.bool).tril()
    return PackedBatch(
        next_tokens=torch.cat(next_tokens)[None],
        features=torch.cat(features)[None],
        targets=torch.cat(targets)[None],
        position_ids=torch.cat(positions)[None],
        loss_mask=torch.cat(mask)[None],
        attention_mask=(same & causal)[None, None],
    )


def eagle_loss(
    predicted: torch.Tensor, target: torch.Tensor, lm_head: torch.nn.Module, mask: torch.Tensor, ce_weight: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """SmoothL1(feature) + ce_weight x soft CE(policy next-token dist, draft's), masked mean."""
    predicted, target = predicted[mask], target[mask]
    feature_loss = F.smooth_l1_loss(predicted, target, reduction="none").mean(-1)
    with torch.no_grad():
        target_probs = lm_head(target).softmax(-1)
    draft_logits = lm_head(predicted)
    ce = -(target_probs * draft_logits.log_softmax(-1)).sum(-1)
    loss = (feature_loss + ce_weight * ce).mean()
    top1 = (draft_logits.argmax(-1) == target_probs.argmax(-1)).float().mean()
    return loss, {"feature_loss": feature_loss.mean().item(), "ce": ce.mean().item(), "top1": top1.item()}


def drafter_forward(drafter: EagleDrafter, parts: PolicyParts, batch: PackedBatch) -> torch.Tensor:
    """Predicted features for a packed batch (moved to the parts' device)."""
    batch = batch.to(parts.device)
    embeds = parts.embed_tokens(batch.next_tokens)
    position_embeddings = parts.position_embeddings(embeds, batch.position_ids)
    return drafter(embeds, batch.features, position_embeddings, batch.attention_mask)


def new_optimizer(drafter: EagleDrafter, config: DrafterTrainingConfig) -> torch.optim.Optimizer:
    """The drafter's AdamW."""
    return torch.optim.AdamW(drafter.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def training_step(
    drafter: EagleDrafter,
    parts: PolicyParts,
    group: Sequence[PackedBatch],
    optimizer: torch.optim.Optimizer,
    config: DrafterTrainingConfig,
) -> dict[str, float]:
    """One optimizer step over `group` (gradients averaged over its rows); the step's mean metrics."""
    optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, float] = {}
    for batch in group:
        batch = batch.to(parts.device)
        with mixed_precision(parts.device):
            predicted = drafter_forward(drafter, parts, batch)
            loss, parts_metrics = eagle_loss(predicted, batch.targets, parts.lm_head, batch.loss_mask, config.ce_weight)
        (loss / len(group)).backward()
        for key, value in {"loss": loss.item(), **parts_metrics}.items():
            metrics[key] = metrics.get(key, 0.0) + value / len(group)
    torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
    optimizer.step()
    return metrics


def train_drafter(
    drafter: EagleDrafter,
    parts: PolicyParts,
    batches: Sequence[PackedBatch],
    config: DrafterTrainingConfig,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
    on_epoch: Callable[[int, list[dict[str, float]]], None] | None = None,
) -> list[dict[str, float]]:
    """Train in place for `config.epochs` passes; returns per-step metrics (loss, top1, ...).
    `on_step(step, total, metrics)` after each step; `on_epoch(epoch, that epoch's step metrics)`
    after each pass, with the drafter in eval mode."""
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = new_optimizer(drafter, config)
    steps_per_epoch = max(1, -(-len(batches) // config.rows_per_step))
    total = steps_per_epoch * config.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / max(1, total))
    history: list[dict[str, float]] = []
    drafter.train()
    step = 0
    for epoch in range(1, config.epochs + 1):
        epoch_start = len(history)
        order = torch.randperm(len(batches), generator=generator).tolist()
        for start in range(0, len(order), config.rows_per_step):
            metrics = training_step(drafter, parts, [batches[i] for i in order[start : start + config.rows_per_step]], optimizer, config)
            schedule.step()
            step += 1
            history.append(metrics)
            if on_step is not None:
                on_step(step, total, metrics)
        if on_epoch is not None:
            drafter.eval()
            on_epoch(epoch, history[epoch_start:])
            drafter.train()
    drafter.eval()
    return history
