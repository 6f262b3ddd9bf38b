"""The tiny reasoning model: a small Qwen2-architecture transformer pretrained by supervised
next-token prediction on worked solutions of a task, saved in HF format for transformers and SGLang.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from pydantic import BaseModel, Field
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tlt.models.tokenizer import build_char_tokenizer, save_tokenizer
from tlt.tasks import GcdProblem, GcdTask

IGNORE = -100
SPEC_FILE = "tlt_spec.json"


class TinyModelSpec(BaseModel):
    """Architecture and pretraining recipe of the tiny model; the defaults build the bundled one."""

    hidden_size: int = Field(128, ge=16)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(384, ge=16)
    max_position_embeddings: int = Field(1024, ge=64)
    max_value: int = Field(99, ge=3, description="problems use numbers in [1, max_value]")
    steps: int = Field(500, ge=1)
    batch_tokens: int = Field(8192, ge=256, description="padded tokens per optimiser step")
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(50, ge=0)
    weight_decay: float = Field(0.01, ge=0)
    seed: int = 0

    def task(self) -> GcdTask:
        return GcdTask(max_value=self.max_value)

    @classmethod
    def of_checkpoint(cls, model_dir: Path) -> TinyModelSpec:
        """The spec saved beside a checkpoint, or the default one (for checkpoints made elsewhere)."""
        path = model_dir / SPEC_FILE
        return cls.model_validate_json(path.read_text()) if path.exists() else cls()


def qwen2_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """The HF config of the tiny model (untied embeddings: an EAGLE draft borrows both)."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def encode_example(tokenizer: PreTrainedTokenizerFast, problem: GcdProblem) -> tuple[list[int], list[int]]:
    """Token ids of prompt + solution + <eos>, and labels that mask the prompt."""
    prompt = tokenizer(problem.prompt).input_ids
    response = tokenizer(problem.solution()).input_ids + [tokenizer.eos_token_id]
    return prompt + response, [IGNORE] * len(prompt) + response


def length_bucketed_batches(
    examples: list[tuple[list[int], list[int]]], batch_tokens: int, pad_id: int, rng: random.Random
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Group examples of similar length so that padding stays small under a heavy-tailed length
    distribution; each batch holds at most `batch_tokens` padded tokens. Batch order is shuffled."""
    ordered = sorted(examples, key=lambda e: len(e[0]))
    batches, current = [], []
    for example in ordered:
        if current and len(example[0]) * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(example)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return [_pad_batch(batch, pad_id) for batch in batches]


def _pad_batch(batch: list[tuple[list[int], list[int]]], pad_id: int):
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(batch):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(ids)] = 1
    return input_ids, labels, mask


def _batch_stream(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> Iterator[tuple]:
    """Endless batches of fresh training problems, deterministic in `spec.seed`."""
    task, rng = spec.task(), random.Random(spec.seed)
    pool_size = 2048
    round_ = 0
    while True:
        problems = task.sample(pool_size, seed=spec.seed * 1_000_003 + round_, split="train")
        examples = [encode_example(tokenizer, p) for p in problems]
        yield from length_bucketed_batches(examples, spec.batch_tokens, tokenizer.pad_token_id, rng)
        round_ += 1


def pretrain(
    spec: TinyModelSpec, progress: Callable[[int, float], None] | None = None
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Build the tokenizer and train the model from scratch; `progress(step, loss)` after each step."""
    torch.manual_seed(spec.seed)
    tokenizer = build_char_tokenizer(GcdTask.ALPHABET)
    model = Qwen2ForCausalLM(qwen2_config(spec, tokenizer))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, spec))
    batches = _batch_stream(spec, tokenizer)
    for step in range(spec.steps):
        input_ids, labels, mask = next(batches)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if progress is not None:
            progress(step + 1, loss.item())
    model.eval()
    return model, tokenizer


def _lr_factor(step: int, spec: TinyModelSpec) -> float:
    """Linear warm-up, then cosine decay to 10%."""
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def save_model(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec, out: Path) -> None:
    """Write config, safetensors weights, tokenizer and the spec that made them."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, out)
    (out / SPEC_FILE).write_text(spec.model_dump_json(indent=2) + "\n")
