"""What a job's trainer trains, on one rank or sharded over many: the policy (float32 master
weights), the frozen reference for the KL term, AdamW, the policy version, and the update that
steps them; built fresh from the job's model or resumed from a checkpoint. Rank 0 and the other
ranks build it the same way, so their shards line up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from tlt.jobs.spec import JobSpec
from trainer.checkpoints import read_state, restore_training_state
from trainer.distributed import TrainerGroup, shard_policy
from trainer.policy_update import PolicyUpdate


@dataclass(frozen=True)
class ShardingOptions:
    """How a policy is sharded over more than one rank (ignored by a single process)."""

    mixed_precision: bool = False  # bf16 compute and all-gathers, fp32 reduction (GPUs)
    activation_checkpointing: bool = False  # recompute each layer's activations in backward


@dataclass
class TrainingState:
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    tokenizer: PreTrainedTokenizerBase
    update: PolicyUpdate
    version: int
    group: TrainerGroup | None


def training_state(
    spec: JobSpec,
    resume_from: Path | None,
    device: torch.device,
    group: TrainerGroup | None = None,
    sharding: ShardingOptions | None = None,
) -> TrainingState:
    """A fresh policy from `spec.model_path`, or the policy, optimizer and RNG of a checkpoint,
    on `device` (the group's device when sharded)."""
    if group is not None:
        device = group.device
    torch.manual_seed(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
    # Sharded, the weights stay on the CPU until fully_shard moves each layer's shard to the
    # group's device: a GPU never holds more than one unsharded layer.
    placed = torch.device("cpu") if group is not None else device
    policy = AutoModelForCausalLM.from_pretrained(resume_from or spec.model_path, dtype=torch.float32).to(placed)
    policy.train()
    reference = None
    if spec.grpo.kl_coef > 0:
        reference = AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=torch.float32).to(placed).eval()
    sharding = sharding or ShardingOptions()
    if sharding.activation_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if group is not None:
        shard_policy(policy, sharding.mixed_precision)
        if reference is not None:
            shard_policy(reference, sharding.mixed_precision)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=spec.lr, weight_decay=0.0)
    version = 0
    if resume_from is not None:
        version = read_state(resume_from).policy_version
        restore_training_state(resume_from, policy, optimizer, sharded=group is not None)
    world = (group.rank, group.world_size) if group is not None else (0, 1)
    update = PolicyUpdate(spec, policy, optimizer, reference, tokenizer.pad_token_id or 0, device, *world)
    return TrainingState(policy, reference, optimizer, tokenizer, update, version, group)
