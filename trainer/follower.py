"""Ranks 1..N-1 of a sharded trainer: hold their shard of the job's training state and join every
collective that rank 0's trainer starts (`trainer.distributed.Command`), until it says stop."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tlt.jobs.spec import JobSpec
from trainer.checkpoints import CheckpointState, save_checkpoint
from trainer.distributed import Command, TrainerGroup, broadcast_samples, full_state_dict
from trainer.training_state import ShardingOptions, TrainingState, training_state

logger = logging.getLogger(__name__)


def follow(group: TrainerGroup, sharding: ShardingOptions) -> None:
    """Serve rank 0's commands; returns at STOP (rank 0 is shutting down)."""
    state: TrainingState | None = None
    while True:
        command, payload = group.receive()
        if command == Command.STOP:
            return
        if command == Command.START_JOB:
            job = json.loads(payload)
            resume = Path(job["resume_from"]) if job["resume_from"] else None
            state = training_state(JobSpec.model_validate(job["spec"]), resume, group.device, group, sharding)
            logger.info("rank %d: holding its shard of job %s", group.rank, state.update.spec.name)
        elif command == Command.END_JOB:
            state = None
        elif state is None:
            raise RuntimeError(f"rank 0 sent {command.name} outside a job")
        elif command == Command.UPDATE:
            samples, version = broadcast_samples(None)
            state.update(samples, version)
        elif command == Command.GATHER:
            full_state_dict(state.policy)
        elif command == Command.SAVE:
            job = json.loads(payload)
            checkpoint = CheckpointState(**job["state"])
            save_checkpoint(Path(job["root"]), checkpoint, state.policy, state.tokenizer, state.optimizer, sharded=True)
