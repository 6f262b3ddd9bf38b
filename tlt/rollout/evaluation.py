"""Scoring a model on its task: generate responses, grade them, summarise lengths and accuracy."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch
from pydantic import BaseModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from tlt.models.hf_generate import greedy_generate
from tlt.rollout.client import RolloutClient, SamplingParams
from tlt.rollout.stats import RolloutSummary, summarize
from tlt.tasks import GcdProblem


class Rollout(BaseModel):
    """One graded response."""

    a: int
    b: int
    sample: int
    prompt_ids: list[int]
    output_ids: list[int]
    response: str
    length: int
    reward: float
    finish_reason: str | None = None
    finished_s: float | None = None  # seconds from the start of the batch (server rollouts)
    spec_verify_ct: int = 0  # speculative verification steps (server rollouts with SD)
    spec_accepted_drafts: int = 0


def response_length(output_ids: Sequence[int], eos_token_id: int) -> int:
    """Tokens generated, not counting the end token."""
    return len(output_ids) - (1 if output_ids and output_ids[-1] == eos_token_id else 0)


def grade(
    problem: GcdProblem,
    sample: int,
    prompt_ids: list[int],
    output_ids: list[int],
    tokenizer: PreTrainedTokenizerBase,
    finish_reason: str | None = None,
) -> Rollout:
    """A `Rollout` from raw output ids."""
    text = tokenizer.decode(output_ids, skip_special_tokens=True)
    return Rollout(
        a=problem.a,
        b=problem.b,
        sample=sample,
        prompt_ids=prompt_ids,
        output_ids=output_ids,
        response=text,
        length=response_length(output_ids, tokenizer.eos_token_id),
        reward=problem.reward(text),
        finish_reason=finish_reason,
    )


def evaluate_with_hf(
    model_dir: Path,
    problems: Sequence[GcdProblem],
    max_new_tokens: int,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[RolloutSummary, list[Rollout]]:
    """Greedy responses from HF transformers (no server needed)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [tokenizer(p.prompt).input_ids for p in problems]
    outputs = greedy_generate(
        model, prompts, max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, on_batch=on_progress
    )
    rollouts = [grade(p, 0, ids, out, tokenizer) for p, ids, out in zip(problems, prompts, outputs)]
    return summarize([r.length for r in rollouts], [r.reward for r in rollouts]), rollouts


def rollout_with_server(
    client: RolloutClient,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[GcdProblem],
    samples_per_problem: int,
    params: SamplingParams,
    max_in_flight: int = 1024,
    on_done: Callable[[Rollout], None] | None = None,
) -> tuple[RolloutSummary, list[Rollout]]:
    """`samples_per_problem` responses per problem from a rollout server. The whole batch is in
    flight at once (up to `max_in_flight`), as an RL step sends it, so the server's running batch
    shrinks as responses finish and the long tail shows."""
    jobs = [(p, s) for p in problems for s in range(samples_per_problem)]
    rollouts: list[Rollout] = []
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(len(jobs), max_in_flight)) as pool:
        prompt_ids = {p: tokenizer(p.prompt).input_ids for p in problems}
        futures = {pool.submit(client.generate, prompt_ids[p], params): (p, s) for p, s in jobs}
        for future in as_completed(futures):
            problem, sample = futures[future]
            completion = future.result()
            rollout = grade(
                problem, sample, prompt_ids[problem], completion.output_ids, tokenizer, completion.finish_reason
            )
            rollout.finished_s = time.monotonic() - started
            rollout.spec_verify_ct = completion.spec_verify_ct
            rollout.spec_accepted_drafts = completion.spec_accepted_drafts
            rollouts.append(rollout)
            if on_done is not None:
                on_done(rollout)
    rollouts.sort(key=lambda r: (r.a, r.b, r.sample))
    return summarize([r.length for r in rollouts], [r.reward for r in rollouts]), rollouts
