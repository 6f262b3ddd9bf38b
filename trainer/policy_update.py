"""The GRPO policy update over one RL step's samples: `updates_per_step` optimizer steps over
mini-batches, each accumulated over micro-batches of at most `tokens_per_micro_batch` padded
tokens, with the clipped token-level loss. Data-parallel over the ranks of a trainer group: every
rank holds all samples and runs its share of each mini-batch's micro-batches; FSDP2 sums the
gradients, so N ranks take the optimizer step one process would."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tlt.jobs.spec import JobSpec
from trainer.grpo import grpo_loss, token_logprobs


@dataclass
class Sample:
    """One response in the loss: its tokens, the server's log-probabilities of them, its advantage."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    advantage: float
    counted: bool  # in the loss (not masked by the overlong filter)


def trainable(samples: list[Sample]) -> list[Sample]:
    """The samples the loss uses: counted, with a response and its log-probabilities."""
    return [s for s in samples if s.counted and s.output_ids and len(s.logprobs) == len(s.output_ids)]


class PolicyUpdate:
    """Runs the update of `policy` (plain, or sharded with FSDP2 over `world_size` ranks)."""

    def __init__(
        self,
        spec: JobSpec,
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        reference: torch.nn.Module | None,
        pad_id: int,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.spec, self.policy, self.optimizer, self.reference = spec, policy, optimizer, reference
        self.pad_id, self.device, self.rank, self.world_size = pad_id, device, rank, world_size

    def __call__(self, samples: list[Sample], version: int) -> dict[str, float]:
        """Update the policy on the samples of the step that produced policy `version + 1`; returns
        the token-weighted loss and clip fraction. Every rank calls it with the same samples."""
        counted = trainable(samples)
        if not counted:
            return {"loss": 0.0, "clip_fraction": 0.0}
        updates = self.spec.updates_per_step
        order = torch.randperm(len(counted), generator=torch.Generator().manual_seed(self.spec.seed * 7919 + version)).tolist()
        minibatches = [[counted[j] for j in order[k::updates]] for k in range(updates)]
        totals = torch.zeros(2, dtype=torch.float64)
        for minibatch in minibatches:
            tokens_total = sum(len(s.output_ids) for s in minibatch)
            chunks = self._micro_batches(minibatch)
            mine = chunks[self.rank :: self.world_size]
            self.optimizer.zero_grad(set_to_none=True)
            # FSDP pairs every rank's forward and backward passes (all-gathers, reduce-scatters): a
            # rank with fewer micro-batches runs the first one again at weight 0.
            for k in range(math.ceil(len(chunks) / self.world_size)):
                chunk = mine[k] if k < len(mine) else chunks[0]
                weight = sum(len(s.output_ids) for s in chunk) / tokens_total if k < len(mine) else 0.0
                loss, metrics = self._loss(chunk)
                # FSDP averages the ranks' gradients; the mini-batch's gradient is their sum (a
                # sum reduction needs PREMUL_SUM, which gloo lacks).
                (loss * weight * self.world_size).backward()
                totals += torch.tensor([metrics["loss"], metrics["clip_fraction"]], dtype=torch.float64) * weight / updates
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
            self.optimizer.step()
        if self.world_size > 1:
            dist.all_reduce(totals)
        return {"loss": float(totals[0]), "clip_fraction": float(totals[1])}

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        chunks, current, width = [], [], 0
        for sample in sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.output_ids)):
            length = len(sample.prompt_ids) + len(sample.output_ids)
            if current and max(width, length) * (len(current) + 1) > self.spec.tokens_per_micro_batch:
                chunks.append(current)
                current, width = [], 0
            current.append(sample)
            width = max(width, length)
        return [*chunks, current] if current else chunks

    def _loss(self, chunk: list[Sample]) -> tuple[torch.Tensor, dict[str, float]]:
        width = max(len(s.prompt_ids) + len(s.output_ids) for s in chunk)
        ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width - 1))
        old = torch.zeros((len(chunk), width - 1))
        advantages = torch.tensor([s.advantage for s in chunk])
        for row, s in enumerate(chunk):
            sequence = s.prompt_ids + s.output_ids
            ids[row, : len(sequence)] = torch.tensor(sequence)
            attention[row, : len(sequence)] = 1
            start = len(s.prompt_ids) - 1  # position predicting the first response token
            mask[row, start : start + len(s.output_ids)] = 1
            old[row, start : start + len(s.output_ids)] = torch.tensor(s.logprobs)
        ids, attention = ids.to(self.device), attention.to(self.device)
        mask, old, advantages = mask.to(self.device), old.to(self.device), advantages.to(self.device)
        # The servers sampled from softmax(logits / T) and returned those log-probabilities: the
        # importance ratio must compare the same distribution (jobs sample with top-p 1, top-k off).
        temperature = self.spec.temperature
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            logprobs = token_logprobs(self.policy(input_ids=ids, attention_mask=attention).logits, ids, temperature)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = token_logprobs(self.reference(input_ids=ids, attention_mask=attention).logits, ids, temperature)
        return grpo_loss(logprobs, old, advantages, mask, self.spec.grpo, ref)
