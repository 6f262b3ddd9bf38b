"""The GRPO loop of one job: roll out G samples per prompt over the rollout pool, score them,
compute group advantages, update the HF policy with the clipped token-level loss, publish the new
version to the rollout servers. One `step()` is one RL step; its metrics say where the time went."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path

import torch

from tlt.jobs.records import StepMetrics
from tlt.jobs.spec import JobSpec
from tlt.rollout.client import SamplingParams
from tlt.rollout.pool import RolloutPool, RolloutRequest
from tlt.tasks import GcdProblem, MathProblem, task_of
from trainer.checkpoints import CheckpointState, save_checkpoint
from trainer.distributed import Command, TrainerGroup, broadcast_samples, full_state_dict
from trainer.grpo import ScoredGroup, group_advantages, informative_groups, shaped_rewards
from trainer.policy_update import Sample, trainable
from trainer.training_state import ShardingOptions, training_state
from trainer.version_barrier import VersionBarrier

logger = logging.getLogger(__name__)


def sample_seed(job_seed: int, key: str) -> int:
    """A stable per-sample sampling seed. A re-sent sample repeats its tokens only without adaptive
    speculation (the verify coins depend on the arms run, i.e. on the batch); it always comes from
    the policy's own distribution."""
    return int.from_bytes(hashlib.sha256(f"{job_seed}:{key}".encode()).digest()[:4], "little") & 0x7FFFFFFF


class GrpoTrainer:
    """Owns the policy and its optimiser (rank 0's shard of them, when `group` has more ranks:
    every collective it starts is announced to the others, see `trainer.follower`); `step(n)` runs
    RL step n. `close()` when the job ends."""

    def __init__(
        self,
        spec: JobSpec,
        pool: RolloutPool,
        barrier: VersionBarrier,
        servers: Callable[[], Sequence[str]],
        resume_from: Path | None = None,
        device: str = "cpu",
        group: TrainerGroup | None = None,
        sharding: ShardingOptions | None = None,
        update_window: Callable[[], AbstractContextManager] = nullcontext,
    ) -> None:
        """A fresh policy from `spec.model_path`, or the policy, optimizer and RNG of a checkpoint,
        trained on `device` (float32 master weights; bf16 autocast on CUDA). Each step's update
        and publish run inside `update_window()` (e.g. `UpdateWindow.marked`)."""
        self.spec, self.pool, self.barrier, self.servers, self.group = spec, pool, barrier, servers, group
        self.update_window = update_window
        if group is not None:
            job = {"spec": spec.model_dump(mode="json"), "resume_from": str(resume_from) if resume_from else None}
            group.command(Command.START_JOB, json.dumps(job).encode())
        state = training_state(spec, resume_from, torch.device(device), group, sharding)
        self.device, self.tokenizer, self.policy, self.optimizer = state.update.device, state.tokenizer, state.policy, state.optimizer
        self.update, self.version = state.update, state.version
        self.task = task_of(spec.task, spec.dataset_path)

    def close(self) -> None:
        """Release the other ranks' shards of this job."""
        if self.group is not None:
            self.group.command(Command.END_JOB)

    def checkpoint(self, root: Path, next_step: int, drafter_version: int = 0) -> Path:
        """Save what a resumed job needs to continue at `next_step`."""
        state = CheckpointState(next_step=next_step, policy_version=self.version, drafter_version=drafter_version)
        if self.group is not None:
            self.group.command(Command.SAVE, json.dumps({"root": str(root), "state": asdict(state)}).encode())
        return save_checkpoint(root, state, self.policy, self.tokenizer, self.optimizer, sharded=self.group is not None)

    def publish(self) -> float:
        """Make the current weights policy version `self.version` on every server (servers that
        cannot load it now are admitted once they do); returns the seconds it took. Call it once
        before the first step (servers may hold anything: another job's policy)."""
        started = time.monotonic()
        weights = None
        if self.group is not None:
            self.group.command(Command.GATHER)
            weights = full_state_dict(self.policy)
        location = self.barrier.publisher.write(self.policy, self.tokenizer, self.version, weights)
        failed = self.barrier.publish(self.servers(), location, self.version)
        if failed:
            logger.warning("policy v%d not loaded by %s yet: they get no work until they load it", self.version, failed)
        return time.monotonic() - started

    def evaluate(self, problems: int = 128, temperature: float = 0.0, samples: int = 1) -> float:
        """Accuracy of the served policy on held-out (test-split) problems: greedy by default, or
        `samples` per problem at `temperature` (seeded)."""
        params = SamplingParams(max_new_tokens=self.spec.max_new_tokens, temperature=temperature)
        held_out = self.task.sample(problems, seed=self.spec.seed + 7919, split="test")
        batch = [
            RolloutRequest(f"eval-{i}-{k}", i, tuple(self.tokenizer(p.prompt).input_ids), params, seed=sample_seed(self.spec.seed, f"eval-{i}-{k}"))
            for i, p in enumerate(held_out)
            for k in range(samples)
        ]
        completions, _ = self.pool.run(batch)
        texts = [self.tokenizer.decode(completions[r.key].output_ids, skip_special_tokens=True) for r in batch]
        return sum(held_out[r.group].reward(t) for r, t in zip(batch, texts, strict=True)) / len(batch)

    def problems(self, step: int) -> list[GcdProblem] | list[MathProblem]:
        return self.task.sample(self.spec.prompts_per_step, seed=self.spec.seed * 1_000_003 + step, split="train")

    def step(self, step: int) -> StepMetrics:
        spec = self.spec
        problems = self.problems(step)
        params = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature)
        batch = []
        for i, problem in enumerate(problems):
            prompt_ids = tuple(self.tokenizer(problem.prompt).input_ids)
            for g in range(spec.samples_per_prompt):
                key = f"{step}-{i}-{g}"
                batch.append(RolloutRequest(key, i, prompt_ids, params, seed=sample_seed(spec.seed, key)))
        started = time.monotonic()
        finish_times: list[float] = []
        completions, stats = self.pool.run(batch, on_done=lambda r, c: finish_times.append(time.monotonic() - started))
        rollout_s = time.monotonic() - started
        finish_times.sort()
        tail_s = finish_times[-1] - finish_times[int(0.9 * (len(finish_times) - 1))]

        samples, rewards_all, groups_used = self._score(problems, batch, completions)
        with self.update_window():
            train_start = time.monotonic()
            metrics = self._update(samples)
            train_s = time.monotonic() - train_start

            stale = sum(1 for c in completions.values() if c.weight_version != str(self.version))
            self.version += 1
            publish_s = self.publish()

        verify = sum(c.spec_verify_ct for c in completions.values())
        tokens = sum(len(c.output_ids) for c in completions.values())
        # Each verification commits its accepted drafts plus one token of the policy's own.
        speculated = verify + sum(c.spec_accepted_drafts for c in completions.values())
        return StepMetrics(
            step=step,
            policy_version=self.version - 1,
            reward_mean=sum(rewards_all) / len(rewards_all),
            samples=len(batch),
            groups_used=groups_used,
            response_tokens=tokens,
            rollout_s=rollout_s,
            tail_s=tail_s,
            train_s=train_s,
            publish_s=publish_s,
            loss=metrics["loss"],
            clip_fraction=metrics["clip_fraction"],
            spec_accept_length=speculated / verify if verify else 0.0,
            speculated_fraction=speculated / tokens if tokens else 0.0,
            resent=stats.resent,
            stale_samples=stale,
            samples_by_server=dict(stats.by_server),
        )

    def _score(self, problems, batch, completions) -> tuple[list[Sample], list[float], int]:
        """Samples with their advantages (groups without signal dropped when configured), the raw
        rewards, and how many groups have any signal."""
        spec, G = self.spec, self.spec.samples_per_prompt
        raw, shaped_all, truncated_all = [], [], []
        for i, problem in enumerate(problems):
            group = [completions[r.key] for r in batch[i * G : (i + 1) * G]]
            texts = [self.tokenizer.decode(c.output_ids, skip_special_tokens=True) for c in group]
            scored = ScoredGroup(
                rewards=[problem.reward(t) for t in texts],
                lengths=[len(c.output_ids) for c in group],
                truncated=[c.finish_reason == "length" for c in group],
            )
            raw += scored.rewards
            shaped_all.append(shaped_rewards(scored, spec.grpo, spec.max_new_tokens))
            truncated_all.append(scored.truncated)
        rewards = torch.tensor(shaped_all)
        advantages = group_advantages(rewards, spec.grpo.normalize_std)
        informative = informative_groups(rewards)
        keep = informative if spec.grpo.filter_zero_variance else torch.ones(len(problems), dtype=torch.bool)
        samples = []
        for i in range(len(problems)):
            if not keep[i]:
                continue
            for g in range(G):
                request = batch[i * G + g]
                counted = not (spec.grpo.overlong == "filter" and truncated_all[i][g])
                completion = completions[request.key]
                samples.append(
                    Sample(list(request.prompt_ids), completion.output_ids, completion.logprobs or [], float(advantages[i, g]), counted)
                )
        return samples, raw, int(informative.sum())

    def _update(self, samples: list[Sample]) -> dict[str, float]:
        """The policy update on this step's samples, on every rank of the group."""
        samples = trainable(samples)
        if self.group is not None:
            self.group.command(Command.UPDATE)
            broadcast_samples(samples, self.version)
        return self.update(samples, self.version)
