"""The SGLang plugin's parts that run without a server: CPU op registration, the CPU environment,
and the prompt checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rollout_server import cpu
from rollout_server.request_checks import check_prompt_ids

_REGISTER = """
import torch
from rollout_server import plugin
first, second = plugin.register_cpu_ops(), plugin.register_cpu_ops()
assert first == list(plugin.CPU_OPS) and second == [], (first, second)
table = torch.zeros(2, 6, dtype=torch.int32)
torch.ops.sgl_kernel.assign_req_to_token_pool_cpu(
    torch.tensor([1, 0]), table, torch.tensor([0, 2]), torch.tensor([3, 4]), torch.tensor([7, 8, 9, 5, 6]), 6
)
assert table.tolist() == [[0, 0, 5, 6, 0, 0], [7, 8, 9, 0, 0, 0]], table
bonus = torch.zeros(2, dtype=torch.int64)
torch.ops.sgl_kernel.fill_bonus_tokens_cpu(torch.tensor([[1, 2], [3, 4]]), torch.tensor([2, 1]), bonus, 2)
assert bonus.tolist() == [2, 3]
print("ok")
"""


def test_plugin_registers_the_cpu_ops_as_torch_operators_once() -> None:
    # Operator registration is process-wide: run it in a fresh interpreter.
    result = subprocess.run(
        [sys.executable, "-c", _REGISTER], capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, cpu.CPU_ENGINE_ENV: "1"},
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_cpu_environment_adds_the_stand_in_once_and_only_without_a_real_sgl_kernel(monkeypatch) -> None:
    env = cpu.cpu_environment({"PYTHONPATH": "/x"})
    assert env[cpu.CPU_ENGINE_ENV] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == ["/x", str(cpu.SHIM_DIR)]
    assert cpu.cpu_environment(env)["PYTHONPATH"] == env["PYTHONPATH"]
    monkeypatch.setattr(cpu, "real_sgl_kernel_installed", lambda: True)
    assert cpu.cpu_environment({"PYTHONPATH": "/x"})["PYTHONPATH"] == "/x"


def test_cpu_environment_keeps_step_temporaries_in_the_heap_unless_the_caller_chose() -> None:
    env = cpu.cpu_environment({})
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) == 32 * 1024 * 1024
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= int(env["MALLOC_MMAP_THRESHOLD_"])
    assert cpu.cpu_environment({"MALLOC_MMAP_THRESHOLD_": "4096"})["MALLOC_MMAP_THRESHOLD_"] == "4096"


def test_no_real_sgl_kernel_here_and_the_stand_in_is_not_mistaken_for_one() -> None:
    sys.path.append(str(cpu.SHIM_DIR))
    try:
        assert not cpu.real_sgl_kernel_installed()
    finally:
        sys.path.remove(str(cpu.SHIM_DIR))


@pytest.mark.parametrize("ids, message", [([], "empty"), ([1, 16], "out of the vocabulary"), ([-1], "out of")])
def test_bad_prompts_are_rejected(ids, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_prompt_ids(ids, vocab_size=16)


def test_good_prompts_and_embedding_inputs_pass() -> None:
    check_prompt_ids([0, 15, 3], vocab_size=16)
    check_prompt_ids(None, vocab_size=16)


def test_every_hook_target_exists_in_this_sglang() -> None:
    """HookRegistry patches by dotted name: a name SGLang renamed would silently patch nothing."""
    import importlib

    from rollout_server import plugin

    targets = [plugin._GET_LOADS, plugin._ADAPTIVE_POLICY, plugin._STREAM_OUTPUT, plugin._RUN_BATCH, plugin._VERIFY_USES_GREEDY, plugin._RESOLVE_SPEC_TOKENS,
               plugin._AMX_FALLBACK_PASS, f"{plugin._WEIGHT_UPDATER}.release_memory_occupation",
               f"{plugin._WEIGHT_UPDATER}.resume_memory_occupation"]  # fmt: skip
    for target in targets:
        module_name, _, rest = target.partition(".srt.")
        parts = f"{module_name}.srt.{rest}".split(".")
        for split in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:split]))
            except ModuleNotFoundError:
                continue
            for name in parts[split:]:
                obj = getattr(obj, name)
            break
        else:
            pytest.fail(f"{target} not found")


def test_steps_without_drafts_are_not_counted_as_verifications(tmp_path) -> None:
    """SGLang's result processor counts every step of the adaptive worker as a verification; the
    plugin takes back the count of a step the bandit ran at arm 0 (the policy knows the arm of the
    step each report belongs to), and leaves speculative steps' counts alone."""
    import json
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from rollout_server import plugin
    from rollout_server.adaptive_policy import BanditSpecPolicy, SpecMetrics, adaptive_config_file
    from tlt.speculation.bandit import BanditConfig, SpecArm

    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(adaptive_config_file(BanditConfig(arms=[SpecArm(draft_steps=s) for s in (0, 2)]))))
    policy = BanditSpecPolicy(2, str(path), metrics=SpecMetrics(CollectorRegistry()), synchronous_launch=True)
    processor = SimpleNamespace(model_worker=SimpleNamespace(adaptive_controller=SimpleNamespace(params=policy)))
    batch = SimpleNamespace(reqs=[SimpleNamespace(spec_verify_ct=0), SimpleNamespace(spec_verify_ct=0)])

    def resolve(processor, result, batch):  # what SGLang's method does with the counts and the policy
        for req in batch.reqs:
            req.spec_verify_ct += 1
        policy.on_verify_complete([result] * len(batch.reqs), batch_size=len(batch.reqs))
        return "tokens"

    arms = []
    for _ in range(4):  # the bandit tries arm 0, then arm 2, then its UCB choices
        arms.append(policy.get_steps_for_batch(2))
        assert plugin._count_speculative_steps_only(resolve, processor, 1 if arms[-1] else 0, batch) == "tokens"
    assert arms[:2] == [0, 2]
    assert [req.spec_verify_ct for req in batch.reqs] == [sum(1 for arm in arms if arm)] * 2
