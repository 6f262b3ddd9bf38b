"""One RL step's worth of made-up samples for the bundled policy, the same in every process."""

from __future__ import annotations

import torch

from tlt.jobs.spec import JobSpec
from tlt.paths import BUNDLED_MODEL
from trainer.policy_update import Sample


def job_spec() -> JobSpec:
    """Two mini-batches of several micro-batches each (an odd number: one rank runs a padding
    pass), a KL term (the reference is sharded too), a learning rate that moves the weights."""
    grpo = {"kl_coef": 0.05}
    return JobSpec(name="sharded", model_path=BUNDLED_MODEL, updates_per_step=2, tokens_per_micro_batch=256, lr=1e-3, grpo=grpo)


def samples(count: int = 24, seed: int = 0) -> list[Sample]:
    generator = torch.Generator().manual_seed(seed)
    made = []
    for i in range(count):
        prompt = torch.randint(3, 16, (int(torch.randint(6, 20, (1,), generator=generator)),), generator=generator)
        output = torch.randint(3, 16, (int(torch.randint(2, 40, (1,), generator=generator)),), generator=generator)
        logprobs = -torch.rand(len(output), generator=generator, dtype=torch.float64) * 3
        advantage = float(torch.randn(1, generator=generator, dtype=torch.float64))
        made.append(Sample(prompt.tolist(), output.tolist(), logprobs.tolist(), advantage, counted=i % 7 != 3))
    return made
