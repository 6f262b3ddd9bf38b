"""The rollout server's settings model: validation, SGLang translation, CLI and env sources."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollout_server.launch import parse_settings
from rollout_server.sglang_args import bandit_config, sglang_argv
from tlt.settings import common
from tlt.settings.rollout_server import RolloutServerSettings


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.fixture
def usable_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sees a usable GPU (the device boundary: this machine has none)."""
    monkeypatch.setattr(common, "cuda_available", lambda: True)


@pytest.fixture
def unusable_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A GPU device node exists, but torch cannot use it (an old driver, say)."""
    (tmp_path / "nvidia0").touch()
    monkeypatch.setattr(common, "GPU_DEVICE_NODES", str(tmp_path / "nvidia[0-9]*"))
    monkeypatch.setattr(common, "cuda_available", lambda: False)


def test_a_gpu_less_run_refuses_device_cuda_saying_why(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "cuda_available", lambda: False)
    with pytest.raises(ValidationError, match="device cuda: torch .* sees no usable GPU; check the driver"):
        RolloutServerSettings(model_path=model_dir, device="cuda")


def test_auto_never_falls_back_to_the_cpu_beside_a_gpu_torch_cannot_use(model_dir: Path, unusable_gpu: None) -> None:
    with pytest.raises(ValidationError, match="a GPU is present .* cannot use it"):
        RolloutServerSettings(model_path=model_dir)
    assert RolloutServerSettings(model_path=model_dir, device="cpu").resolved_device() == "cpu"


def test_auto_picks_the_cpu_without_a_gpu_and_cuda_with_one(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(common, "GPU_DEVICE_NODES", str(tmp_path / "no-such-node[0-9]*"))
    monkeypatch.setattr(common, "cuda_available", lambda: False)
    assert RolloutServerSettings(model_path=model_dir).resolved_device() == "cpu"
    monkeypatch.setattr(common, "cuda_available", lambda: True)
    assert RolloutServerSettings(model_path=model_dir).resolved_device() == "cuda"


def test_gpus_serve_bf16_never_sglangs_auto(model_dir: Path, usable_gpu: None) -> None:
    """SGLang's --dtype auto maps a float32 config (TLT's CPU checkpoints) to float16."""
    argv = sglang_argv(RolloutServerSettings(model_path=model_dir, device="cuda"))
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert common.resolve_dtype("auto", "cpu") == "float32" and common.resolve_dtype("float16", "cuda") == "float16"


def test_cpu_defaults_pick_native_backends_and_fp32(model_dir: Path) -> None:
    argv = sglang_argv(RolloutServerSettings(model_path=model_dir, device="cpu", port=1234))
    joined = " ".join(argv)
    assert "--device cpu" in joined
    assert "--attention-backend intel_amx" in joined
    assert "--sampling-backend pytorch" in joined
    assert "--dtype float32" in joined
    assert "--max-total-tokens 65536" in joined
    assert "--skip-server-warmup" in argv
    assert "--sleep-on-idle" in argv
    assert argv[argv.index("--port") + 1] == "1234"


def test_gpu_keeps_sglang_backends(model_dir: Path, usable_gpu: None) -> None:
    argv = sglang_argv(RolloutServerSettings(model_path=model_dir, device="cuda", dtype="bfloat16"))
    assert "--attention-backend" not in argv
    assert "--max-total-tokens" not in argv
    assert argv[argv.index("--dtype") + 1] == "bfloat16"


@pytest.mark.parametrize(
    "field, value",
    [("port", 0), ("port", 70000), ("max_total_tokens", 10), ("mem_fraction_static", 1.5), ("device", "tpu")],
)
def test_bad_values_are_rejected_naming_the_field(model_dir: Path, field: str, value) -> None:
    with pytest.raises(ValidationError) as err:
        RolloutServerSettings(model_path=model_dir, **{field: value})
    assert field in str(err.value)


def test_model_path_must_be_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="config.json"):
        RolloutServerSettings(model_path=tmp_path)


def test_command_line_with_passthrough(model_dir: Path) -> None:
    settings = parse_settings(
        ["--model-path", str(model_dir), "--port", "4321", "--enable-return-hidden-states", "--", "--chunked-prefill-size", "512"]
    )
    assert settings.port == 4321 and settings.enable_return_hidden_states
    assert sglang_argv(settings)[-2:] == ["--chunked-prefill-size", "512"]


def test_environment_variables_fill_settings(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLT_ROLLOUT_MODEL_PATH", str(model_dir))
    monkeypatch.setenv("TLT_ROLLOUT_MAX_RUNNING_REQUESTS", "17")
    settings = parse_settings([])
    assert settings.model_path == model_dir and settings.max_running_requests == 17


def test_help_documents_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rollout_server", "--help"], capture_output=True, text=True, check=False, timeout=120
    ).stdout
    for name in RolloutServerSettings.model_fields:
        assert "--" + name.replace("_", "-") in out, name


def test_invalid_flag_exits_with_an_error(model_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollout_server", "--model-path", str(model_dir), "--port", "-3"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode != 0
    assert "port" in result.stderr


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_speculation_translates_to_sglangs_eagle_flags(model_dir: Path, tmp_path: Path) -> None:
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    chain = RolloutServerSettings(model_path=model_dir, device="cpu", speculative="always", draft_model_path=drafter, draft_steps=3)
    argv = sglang_argv(chain)
    assert _flag(argv, "--speculative-algorithm") == "EAGLE"
    assert _flag(argv, "--speculative-num-steps") == "3"
    assert _flag(argv, "--speculative-eagle-topk") == "1"
    assert _flag(argv, "--speculative-num-draft-tokens") == "4"
    assert _flag(argv, "--max-running-requests") == "1024"  # not SGLang's speculative cap of 48
    assert "--speculative-adaptive" not in argv

    tree = chain.model_copy(update={"draft_topk": 2, "draft_tokens": 6, "max_running_requests": 64})
    argv = sglang_argv(tree)
    assert _flag(argv, "--speculative-num-draft-tokens") == "6"
    assert _flag(argv, "--max-running-requests") == "64"

    adaptive = RolloutServerSettings(model_path=model_dir, speculative="adaptive", draft_model_path=drafter)
    assert [arm.draft_steps for arm in bandit_config(adaptive).arms] == [0, 1, 2, 3, 4]
    pinned = adaptive.model_copy(update={"speculative_arms": [0]})
    assert [arm.draft_steps for arm in bandit_config(pinned).arms] == [0]
    assert _flag(sglang_argv(pinned, tmp_path / "adaptive.json"), "--speculative-num-steps") == "0"
    # History arms beside EAGLE's; SGLang starts on (and sizes for) the longest of all.
    mixed = adaptive.model_copy(update={"history_arms": [2, 8]})
    assert [arm.label for arm in bandit_config(mixed).arms] == ["off", *(f"eagle{k}" for k in (1, 2, 3, 4)), "history2", "history8"]
    assert _flag(sglang_argv(mixed, tmp_path / "adaptive.json"), "--speculative-num-steps") == "8"
    history_only = RolloutServerSettings(
        model_path=model_dir, speculative="adaptive", draft_model_path=drafter, speculative_arms=[], history_arms=[3]
    )
    assert [arm.label for arm in bandit_config(history_only).arms] == ["history3"]
    with pytest.raises(ValueError, match="config file"):
        sglang_argv(adaptive)
    argv = sglang_argv(adaptive, tmp_path / "adaptive.json")
    assert _flag(argv, "--speculative-adaptive-config") == str(tmp_path / "adaptive.json")
    assert "--speculative-adaptive" in argv
    assert "--max-running-requests" not in sglang_argv(RolloutServerSettings(model_path=model_dir))


@pytest.mark.parametrize(
    ("fields", "with_drafter", "message"),
    [
        ({"speculative": "always"}, False, "draft_model_path"),
        ({"speculative": "adaptive", "draft_topk": 2, "draft_tokens": 6}, True, "chains"),
        ({"speculative": "always", "draft_topk": 2}, True, "needs draft_tokens"),
        ({"speculative": "always", "draft_tokens": 9}, True, "leave draft_tokens unset"),
        ({"speculative": "always", "speculative_arms": [1]}, True, "needs speculative=adaptive"),
        ({"speculative": "adaptive", "speculative_arms": [0, 5]}, True, "distinct draft lengths in 0..4"),
        ({"speculative": "adaptive", "speculative_arms": []}, True, "distinct draft lengths in 0..4"),
        ({"speculative": "always", "history_arms": [2]}, True, "needs speculative=adaptive"),
        ({"speculative": "adaptive", "history_arms": [0]}, True, "distinct draft lengths in 1..16"),
    ],
)
def test_inconsistent_speculation_settings_are_refused(
    model_dir: Path, tmp_path: Path, fields: dict, with_drafter: bool, message: str
) -> None:
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    if with_drafter:
        fields = {**fields, "draft_model_path": drafter}
    with pytest.raises(ValidationError, match=message):
        RolloutServerSettings(model_path=model_dir, **fields)


def test_samples_job_serves_hidden_states_for_its_spot_worker(model_dir: Path) -> None:
    assert "--enable-return-hidden-states" not in sglang_argv(RolloutServerSettings(model_path=model_dir, device="cpu"))
    argv = sglang_argv(RolloutServerSettings(model_path=model_dir, device="cpu", samples_job="j1"))
    assert "--enable-return-hidden-states" in argv


def test_memory_saver_is_refused_on_the_cpu_and_passed_on_a_gpu(model_dir: Path, usable_gpu: None) -> None:
    with pytest.raises(ValidationError, match="enable_memory_saver needs a GPU"):
        RolloutServerSettings(model_path=model_dir, device="cpu", enable_memory_saver=True)
    assert "--enable-memory-saver" in sglang_argv(RolloutServerSettings(model_path=model_dir, device="cuda", enable_memory_saver=True))


def test_the_trainer_uses_the_device_it_is_given_and_publishes_in_its_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    from tlt.settings.trainer import TrainerSettings

    monkeypatch.setattr(common, "cuda_available", lambda: False)
    with pytest.raises(ValidationError, match="device cuda: torch .* sees no usable GPU"):
        TrainerSettings(device="cuda")
    assert TrainerSettings(device="cpu").resolved_dtype() == "float32"
    monkeypatch.setattr(common, "cuda_available", lambda: True)
    gpu = TrainerSettings()
    assert gpu.resolved_device() == "cuda" and gpu.resolved_dtype() == "bfloat16"


def test_gpu_plain_decoding_graphs_cover_the_running_batch(model_dir: Path, usable_gpu: None, tmp_path: Path) -> None:
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    adaptive = RolloutServerSettings(model_path=model_dir, speculative="adaptive", draft_model_path=drafter)
    argv = sglang_argv(adaptive, tmp_path / "adaptive.json")
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == argv[argv.index("--max-running-requests") + 1] == "1024"
    mine = adaptive.model_copy(update={"sglang_args": ["--cuda-graph-max-bs", "128"]})
    assert sglang_argv(mine, tmp_path / "adaptive.json").count("--cuda-graph-max-bs") == 1
    assert "--cuda-graph-max-bs" not in sglang_argv(RolloutServerSettings(model_path=model_dir, device="cpu"))
