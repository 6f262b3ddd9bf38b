"""One bounded round of drafter training from a published version: train on sequences with their
policy features, measure the held-out accept length before and after, and say whether the result
is worth publishing. Used by the spot worker (a slice of idle time) and by the drafter service's
offline warm-up; `check` runs between two units of work and may raise to stop the round."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PretrainedConfig

from tlt.drafter.acceptance import chain_accept_lengths, response_starts
from tlt.drafter.model import EagleDrafter, PolicyParts
from tlt.drafter.training import DrafterTrainingConfig, PolicySequence, pack, train_drafter
from tlt.store.samples_stream import SampleRecord


@dataclass
class RoundResult:
    """The trained drafter's tensors and what the round measured."""

    state: dict[str, torch.Tensor]
    accept_length_before: float
    accept_length: float
    steps: int
    losses: list[float] = field(default_factory=list)

    @property
    def improved(self) -> bool:
        """A round that does not beat its base on held-out sequences is not published."""
        return self.accept_length > self.accept_length_before


def usable_sequences(records: Iterable[SampleRecord]) -> list[PolicySequence]:
    """Training sequences of finished rollouts: those with a response of two tokens or more."""
    return [s for s in map(training_sequence, records) if s is not None]


def training_sequence(record: SampleRecord) -> PolicySequence | None:
    """The rollout as a training sequence; None when its response is shorter than two tokens."""
    return PolicySequence(record.prompt_ids + record.output_ids, len(record.prompt_ids)) if len(record.output_ids) > 1 else None


def split_held_out(
    sequences: Sequence[PolicySequence], fraction: float, seed: int
) -> tuple[list[PolicySequence], list[PolicySequence]]:
    """(train, held_out): a seeded shuffle, then at least one sequence held out."""
    shuffled = list(sequences)
    random.Random(seed).shuffle(shuffled)
    cut = max(1, int(len(shuffled) * fraction))
    return shuffled[cut:], shuffled[:cut]


def held_out_accept_length(
    drafter: EagleDrafter,
    parts: PolicyParts,
    sequences: Sequence[PolicySequence],
    features: Sequence[torch.Tensor],
    draft_steps: int,
    every: int,
    check: Callable[[], None] = lambda: None,
) -> float:
    """Mean chain accept length over every `every`-th response position of the sequences."""
    lengths: list[int] = []
    for sequence, feats in zip(sequences, features):
        check()
        lengths += chain_accept_lengths(drafter, parts, sequence, feats, draft_steps, response_starts(sequence, draft_steps, every))
    return sum(lengths) / max(1, len(lengths))


def train_round(
    policy_config: PretrainedConfig,
    parts: PolicyParts,
    base_state: dict[str, torch.Tensor],
    train: tuple[Sequence[PolicySequence], Sequence[torch.Tensor]],
    held_out: tuple[Sequence[PolicySequence], Sequence[torch.Tensor]],
    training: DrafterTrainingConfig,
    draft_steps: int,
    eval_every: int,
    check: Callable[[], None] = lambda: None,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> RoundResult:
    """Train a drafter from `base_state` on (sequences, features) and measure it before and after,
    on the parts' device (features are moved there)."""
    train = (train[0], [f.to(parts.device) for f in train[1]])
    held_out = (held_out[0], [f.to(parts.device) for f in held_out[1]])
    drafter = EagleDrafter(policy_config).to(parts.device)
    drafter.load_state_dict(base_state)
    drafter.eval()
    before = held_out_accept_length(drafter, parts, *held_out, draft_steps, eval_every, check)
    losses: list[float] = []

    def step_done(step: int, total: int, metrics: dict[str, float]) -> None:
        losses.append(metrics["loss"])
        if on_step is not None:
            on_step(step, total, metrics)
        check()

    train_drafter(drafter, parts, pack(*train, training.tokens_per_row), training, on_step=step_done)
    after = held_out_accept_length(drafter, parts, *held_out, draft_steps, eval_every, check)
    state = {name: tensor.detach().contiguous() for name, tensor in drafter.state_dict().items()}
    return RoundResult(state=state, accept_length_before=before, accept_length=after, steps=len(losses), losses=losses)
