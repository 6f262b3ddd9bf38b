"""The trainer over several ranks (FSDP2 on gloo, real processes under torchrun): the same update,
checkpoints that resume at another number of ranks, published weights that are the full policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.sharded_trainer_samples import job_spec, samples
from trainer.checkpoints import read_state
from trainer.training_state import ShardingOptions, training_state

pytestmark = pytest.mark.slow

RANKS_SCRIPT = Path(__file__).parent / "sharded_trainer_ranks.py"


def _run_ranks(out: Path, ranks: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(RANKS_SCRIPT), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, dict[str, float]]:
    out = tmp_path_factory.mktemp("two-ranks")
    return out, _run_ranks(out, 2)


def _one_process(updates: int = 1):
    """The same updates in one unsharded process: (metrics of the first, the training state)."""
    state = training_state(job_spec(), None, torch.device("cpu"))
    metrics = [state.update(samples(seed=k), version=k) for k in range(updates)]
    return metrics[0], state


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        # A key bias shifts all of a query's attention logits alike: its true gradient is 0, and
        # AdamW turns the rounding noise that stands in for it into steps of about the LR.
        if not name.endswith("k_proj.bias"):
            assert torch.allclose(got[name], value, atol=1e-5, rtol=0), name


def test_two_ranks_take_the_optimizer_step_one_process_takes(two_ranks) -> None:
    out, sharded = two_ranks
    single, state = _one_process()
    assert sharded["loss"] == pytest.approx(single["loss"], abs=1e-5)
    assert sharded["clip_fraction"] == pytest.approx(single["clip_fraction"], abs=1e-5)
    published = load_file(out / "policy" / "policy-v1" / "model.safetensors")
    want = _weights(state.policy)
    # The HF checkpoint leaves the tied head out.
    _assert_close(published, {name: want[name] for name in published})
    moved = max((published[n] - w).abs().max() for n, w in _weights(training_state(job_spec(), None, torch.device("cpu")).policy).items() if n in published)
    assert moved > 1e-4, "the update changed the weights"


def test_a_two_rank_checkpoint_resumes_in_one_process_and_continues_the_same(two_ranks) -> None:
    out, _ = two_ranks
    checkpoint = out / "checkpoints" / "step-1"
    assert read_state(checkpoint).next_step == 1
    resumed = training_state(job_spec(), checkpoint, torch.device("cpu"))
    assert resumed.version == 1
    steps = {int(s["step"]) for s in resumed.optimizer.state_dict()["state"].values()}
    assert steps == {job_spec().updates_per_step}, "AdamW's step count came back with its moments"
    resumed.update(samples(seed=1), version=1)
    _, continuous = _one_process(updates=2)
    _assert_close(_weights(resumed.policy), _weights(continuous.policy))


def test_activation_checkpointing_recomputes_to_the_same_update() -> None:
    plain, _ = _one_process()
    state = training_state(job_spec(), None, torch.device("cpu"), sharding=ShardingOptions(activation_checkpointing=True))
    assert state.policy.is_gradient_checkpointing
    recomputed = state.update(samples(seed=0), version=0)
    assert recomputed["loss"] == pytest.approx(plain["loss"], abs=1e-6)
