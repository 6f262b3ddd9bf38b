"""The job TLT runs, run instead by TRL's `GRPOTrainer` (PyPI `trl`), the trainer a user would pick
otherwise: same initial policy, task, prompts in the same order, samples per prompt, max length,
temperature, learning rate and loss (DAPO clip-higher 0.2/0.28, no KL, token-level mean, group-std
advantages, truncated responses masked), one optimizer update per RL step. It generates with
transformers' `generate` in the trainer's own process (no vLLM on a CPU), on every core.

    python -m benchmarks.trl_grpo [--quick] [--steps N]

Used by `benchmarks.rl_step` as its third arm; on its own it writes `results/trl_grpo.json`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import torch
import typer
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from benchmarks.common import write_json
from tlt.jobs.spec import JobSpec
from tlt.paths import BUNDLED_JOB
from tlt.tasks import GcdTask

# Micro-batches a step's samples are split into (gradient accumulation): the update is one
# optimizer step over all of them either way; this only bounds the activations held at once.
MICRO_BATCHES = 8


class _StepClock(TrainerCallback):
    """Wall time of each optimizer step (its generation included: TRL generates inside the step)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.step_s: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.step_s.append(time.monotonic() - self.started)


def run_trl(spec: JobSpec, work_dir: Path, threads: int | None = None) -> dict:
    """Train `spec` (gcd task) with TRL's GRPOTrainer on the CPU; per-step time and reward."""
    from trl import GRPOConfig, GRPOTrainer  # imported here: only this arm needs TRL

    if spec.task != "gcd":
        raise ValueError("the TRL comparison runs the gcd task")
    if spec.prompts_per_step * spec.samples_per_prompt % MICRO_BATCHES:
        raise ValueError(f"prompts_per_step * samples_per_prompt must divide into {MICRO_BATCHES} micro-batches")
    torch.set_num_threads(threads or os.cpu_count() or 1)
    task = GcdTask()
    # The problems TLT's trainer draws at each step, in its order (GrpoTrainer.problems).
    problems = [p for step in range(spec.steps) for p in task.sample(spec.prompts_per_step, seed=spec.seed * 1_000_003 + step, split="train")]
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems], "problem": list(range(len(problems)))})

    def reward(prompts, completions, problem, **_) -> list[float]:
        return [problems[i].reward(text) for i, text in zip(problem, completions, strict=True)]

    samples = spec.prompts_per_step * spec.samples_per_prompt
    config = GRPOConfig(
        output_dir=str(work_dir),
        use_cpu=True,
        bf16=False,
        seed=spec.seed,
        max_steps=spec.steps,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        per_device_train_batch_size=samples // MICRO_BATCHES,
        gradient_accumulation_steps=MICRO_BATCHES,
        num_generations=spec.samples_per_prompt,
        max_completion_length=spec.max_new_tokens,
        temperature=spec.temperature,
        top_p=1.0,
        beta=spec.grpo.kl_coef,
        epsilon=spec.grpo.clip_low,
        epsilon_high=spec.grpo.clip_high,
        loss_type="dapo",
        scale_rewards="group" if spec.grpo.normalize_std else "none",
        mask_truncated_completions=spec.grpo.overlong == "filter",
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    clock = _StepClock()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(spec.model_path, padding_side="left"),
        callbacks=[clock],
    )
    started = time.monotonic()
    trainer.train()
    job_s = time.monotonic() - started
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    lengths = [row.get("completions/mean_length", 0.0) for row in trainer.state.log_history if "reward" in row]
    return {
        "state": "SUCCEEDED" if len(rewards) == spec.steps else "INCOMPLETE",
        "job_s": job_s,
        "mean_step_s": statistics.fmean(clock.step_s),
        "step_s": clock.step_s,
        "rewards": rewards,
        "mean_response_tokens": statistics.fmean(lengths) if lengths else 0.0,
        "reward_first_half": statistics.fmean(rewards[: len(rewards) // 2] or rewards),
        "reward_second_half": statistics.fmean(rewards[len(rewards) // 2 :]),
        "threads": torch.get_num_threads(),
        "trl_version": __import__("trl").__version__,
    }


def quick_spec(spec: JobSpec) -> JobSpec:
    """A smoke-run size: checks the arm still executes."""
    return spec.model_copy(update={"steps": 2, "prompts_per_step": 8, "max_new_tokens": 128})


def main(
    quick: Annotated[bool, typer.Option(help="2 steps of 8 prompts: checks the benchmark runs")] = False,
    steps: Annotated[int | None, typer.Option(min=1, help="RL steps [default: the bundled job's]")] = None,
) -> None:
    spec = JobSpec.from_yaml(BUNDLED_JOB)
    spec = quick_spec(spec) if quick else spec.model_copy(update={"steps": steps or spec.steps})
    with tempfile.TemporaryDirectory() as tmp:
        result = run_trl(spec, Path(tmp))
    path = write_json("trl_grpo_quick" if quick else "trl_grpo", {"job": spec.model_dump(mode="json"), **result})
    print(f"TRL GRPOTrainer: {result['mean_step_s']:.2f} s per step, reward {result['reward_first_half']:.3f} -> {result['reward_second_half']:.3f}; {path}")


if __name__ == "__main__":
    typer.run(main)
