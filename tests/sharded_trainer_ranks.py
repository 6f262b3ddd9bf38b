"""What the sharded-trainer tests run under torchrun: rank 0 drives a `GrpoTrainer` through one
policy update, a checkpoint and a publish; the other ranks serve it as the trainer's followers do.
`python -m torch.distributed.run --nproc-per-node N tests/sharded_trainer_ranks.py OUT`: rank 0
writes OUT/result.json (loss, clip fraction) and OUT/checkpoints/step-1, OUT/policy/policy-v1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharded_trainer_samples import job_spec, samples

from trainer.distributed import Command, TrainerGroup
from trainer.follower import follow
from trainer.loop import GrpoTrainer
from trainer.policy_publisher import DiskPolicyPublisher
from trainer.training_state import ShardingOptions
from trainer.version_barrier import VersionBarrier


def main(out: Path) -> None:
    torch.set_num_threads(1)
    group = TrainerGroup.from_environment("cpu")
    assert group is not None, "run under torchrun with more than one process"
    if not group.is_main:
        follow(group, ShardingOptions())
        return
    barrier = VersionBarrier(DiskPolicyPublisher(out / "policy"))
    trainer = GrpoTrainer(job_spec(), None, barrier, list, group=group)
    metrics = trainer._update(samples())
    trainer.version += 1
    trainer.checkpoint(out / "checkpoints", next_step=1)
    trainer.publish()
    trainer.close()
    group.command(Command.STOP)
    (out / "result.json").write_text(json.dumps(metrics))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
