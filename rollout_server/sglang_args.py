"""The SGLang command line that `RolloutServerSettings` stand for (TLT's defaults, CPU engine flags,
speculation), and the adaptive bandit those settings configure."""

from __future__ import annotations

from pathlib import Path

from tlt.settings.rollout_server import RolloutServerSettings
from tlt.speculation.bandit import BanditConfig, SpecArm

SPECULATIVE_MAX_RUNNING_REQUESTS = 1024


def bandit_config(settings: RolloutServerSettings) -> BanditConfig:
    """The adaptive policy's configuration: one EAGLE arm per draft length (0..draft_steps by
    default; 0 = off) and one history arm per `history_arms` length."""
    lengths = settings.speculative_arms if settings.speculative_arms is not None else range(settings.draft_steps + 1)
    eagle = [SpecArm(draft_steps=steps) for steps in lengths]
    history = [SpecArm(draft_steps=steps, source="history") for steps in settings.history_arms]
    return BanditConfig(
        arms=eagle + history, max_speculative_batch=settings.max_speculative_batch, catch_up_tokens=settings.catch_up_tokens
    )


def sglang_argv(settings: RolloutServerSettings, adaptive_config_path: Path | None = None) -> list[str]:
    """SGLang's flags for these settings; adaptive speculation needs the path of its config file
    (content: `rollout_server.adaptive_policy.adaptive_config_file`)."""
    s = settings
    device = s.resolved_device()
    argv = ["--model-path", str(s.model_path), "--host", s.host, "--port", str(s.port)]
    argv += ["--device", device, "--log-level", s.log_level]
    if device == "cpu":
        # intel_amx runs on TLT's PyTorch attention ops here (and is SGLang's only CPU backend
        # with speculative verification); PyTorch sampling.
        # No graphs to capture on the CPU (adaptive speculation would otherwise try, per arm).
        argv += ["--attention-backend", "intel_amx", "--sampling-backend", "pytorch", "--disable-cuda-graph"]
    # Target and draft in one dtype (SGLang loads both with it): fp32 on the CPU, bf16 on GPUs.
    argv += ["--dtype", s.resolved_dtype()]
    max_total_tokens = s.max_total_tokens
    if max_total_tokens is None and device == "cpu":
        max_total_tokens = 65536
    max_running = s.max_running_requests or (SPECULATIVE_MAX_RUNNING_REQUESTS if s.speculative != "off" else None)
    # On a GPU the bulk of a rollout runs plain decoding at up to `max_running` requests: its CUDA
    # graphs must cover that range (SGLang's default stops at 256 or less), while the speculative
    # arms capture only up to the bandit's cap (`adaptive_policy.cuda_graph_bs_for_step`).
    graphs_to = max_running if device == "cuda" and max_running and "--cuda-graph-max-bs" not in s.sglang_args else None
    optional = {
        "--max-total-tokens": max_total_tokens,
        "--max-running-requests": max_running,
        "--cuda-graph-max-bs": graphs_to,
        "--context-length": s.context_length,
        "--mem-fraction-static": s.mem_fraction_static,
        "--random-seed": s.random_seed,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    switches = {
        "--enable-return-hidden-states": s.enable_return_hidden_states or s.samples_job is not None,
        "--enable-memory-saver": s.enable_memory_saver,
        "--sleep-on-idle": s.sleep_on_idle,
        "--skip-server-warmup": not s.warmup,
        "--enable-metrics": s.enable_metrics,
    }
    argv += [flag for flag, on in switches.items() if on]
    return argv + _speculative_argv(s, adaptive_config_path) + list(s.sglang_args)


def _speculative_argv(s: RolloutServerSettings, adaptive_config_path: Path | None) -> list[str]:
    if s.speculative == "off":
        return []
    # SGLang's adaptive worker starts on (and sizes its buffers for) the longest arm.
    steps = s.draft_steps if s.speculative != "adaptive" else max(arm.draft_steps for arm in bandit_config(s).arms)
    tokens = s.draft_tokens or steps + 1
    argv = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(s.draft_model_path)]
    argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(s.draft_topk)]
    argv += ["--speculative-num-draft-tokens", str(tokens)]
    if s.speculative == "adaptive":
        if adaptive_config_path is None:
            raise ValueError("adaptive speculation needs the path of its config file")
        argv += ["--speculative-adaptive", "--speculative-adaptive-config", str(adaptive_config_path)]
    return argv
