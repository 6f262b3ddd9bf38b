"""Settings of `python -m rollout_server` (its SGLang command line is built in `rollout_server`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tlt.settings.common import NAME_PATTERN, Device, DeviceSettings, DType, Speculation, process_flags


class RolloutServerSettings(DeviceSettings):
    """Flags of `python -m rollout_server`: SGLang with the TLT plugin and TLT's defaults.

    Arguments after `--` go to SGLang unchanged (see `sglang serve --help`).
    """

    model_config = process_flags("TLT_ROLLOUT_", "python -m rollout_server")

    model_path: Path = Field(description="HF-format checkpoint directory (config, safetensors, tokenizer)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(30000, ge=1, le=65535, description="HTTP port")
    device: Device = Field(
        "auto", description="auto picks cuda when usable, else cpu (and refuses a GPU that torch cannot use)"
    )
    dtype: DType = Field("auto", description="weights/activations dtype; auto: float32 on cpu, bfloat16 on cuda")
    max_total_tokens: int | None = Field(
        None, ge=256, description="KV-cache size in tokens; default 65536 on cpu, SGLang's on gpu"
    )
    max_running_requests: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="running batch cap; with speculation default 1024 (SGLang would cap it at 48, which "
        "throttles the bulk of a rollout batch: TLT speculates only in the tail)",
    )
    context_length: int | None = Field(None, ge=16, description="override the model's context length")
    mem_fraction_static: float | None = Field(
        None, gt=0.0, lt=1.0, description="GPU memory fraction for weights + KV cache (gpu only)"
    )
    random_seed: int | None = Field(None, ge=0, description="seed of SGLang's sampler")
    enable_return_hidden_states: bool = Field(
        False, description="allow return_hidden_states requests (implied by samples_job: its spot worker reads them)"
    )
    enable_memory_saver: bool = Field(
        False,
        description="on a GPU: let the spot worker release the KV cache while it trains (SGLang's memory saver)",
    )
    sleep_on_idle: bool = Field(
        True,
        description="an idle scheduler sleeps instead of spinning a core (SGLang's default spins), "
        "leaving idle time to spot training",
    )
    warmup: bool = Field(
        False,
        description="send SGLang's English warm-up request at start (off: TLT's tiny models have a "
        "character vocabulary that maps it to an empty prompt)",
    )
    speculative: Speculation = Field(
        "off",
        description="EAGLE speculative decoding: off; always (fixed draft steps/top-k); adaptive (TLT's "
        "bandit picks 0..draft-steps per decode step from measured accepted tokens/s)",
    )
    draft_model_path: Path | None = Field(None, description="SGLang EAGLE draft checkpoint (needed with speculation)")
    draft_steps: int = Field(4, ge=1, le=16, description="draft chain length; with adaptive, the longest arm")
    speculative_arms: list[int] | None = Field(
        None,
        description="adaptive only: the draft lengths the bandit chooses from (each 0..draft-steps; 0 = off); "
        "default 0..draft-steps. A single arm pins every step to it (the step-cost benchmark does)",
    )
    history_arms: list[int] = Field(
        default_factory=list,
        description="adaptive only: draft lengths (1..16) of arms whose drafts come from the token history of the "
        "request's prompt group (its own text and prompt, its siblings, earlier epochs, recent responses) instead "
        "of the EAGLE drafter: no draft forward pass. Empty: EAGLE arms only",
    )
    max_speculative_batch: int = Field(
        64, ge=1, le=4096, description="adaptive only: above this running batch size every step runs without drafts"
    )
    catch_up_tokens: int = Field(
        256,
        ge=0,
        le=65536,
        description="adaptive only: steps without drafts skip the drafter, which catches up on up to this many of "
        "each request's latest positions when drafting resumes; 0 runs the drafter at every step (SGLang's way)",
    )
    draft_topk: int = Field(1, ge=1, le=8, description="draft tree branching (always only; adaptive uses chains)")
    draft_tokens: int | None = Field(
        None, ge=2, le=64, description="tokens verified per step; default draft-steps + 1 (the whole chain)"
    )
    drafter_job: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="follow this job's drafter weight channel in Redis (TLT_REDIS_* settings) and swap "
        "new versions in between batches",
    )
    samples_job: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="append every finished sequence (token ids) to this job's samples stream in Redis",
    )
    enable_metrics: bool = Field(False, description="Prometheus metrics at /metrics (SGLang's and TLT's)")
    spot_worker: bool = Field(
        False,
        description="also run this server's spot worker (`python -m rollout_server.spot_worker`, its flags from "
        "TLT_SPOT_* variables) as a child, restarted when it dies: on a GPU pod it then trains on the server's GPU, "
        "which a sidecar container cannot see",
    )
    cpu_threads: int = Field(
        1,
        ge=1,
        le=256,
        description="torch threads of the CPU engine; 1 suits small models, whose ops are too small to "
        "repay thread synchronisation",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("warning", description="SGLang log level")
    sglang_args: list[str] = Field(
        default_factory=list, description="extra SGLang flags (on the command line: after `--`)"
    )

    @model_validator(mode="after")
    def _check_model_path(self) -> RolloutServerSettings:
        if not (self.model_path / "config.json").is_file():
            raise ValueError(f"model_path {self.model_path} has no config.json (expected an HF checkpoint)")
        return self

    @model_validator(mode="after")
    def _check_memory_saver(self) -> RolloutServerSettings:
        if self.enable_memory_saver and self.resolved_device() == "cpu":
            raise ValueError("enable_memory_saver needs a GPU (SGLang's memory release synchronises CUDA)")
        return self

    @model_validator(mode="after")
    def _check_speculation(self) -> RolloutServerSettings:
        if self.speculative == "off":
            if self.drafter_job is not None:
                raise ValueError("drafter_job needs speculation (a drafter to swap)")
            return self
        if self.draft_model_path is None or not (self.draft_model_path / "config.json").is_file():
            raise ValueError(f"speculative={self.speculative} needs draft_model_path with a config.json")
        if self.speculative == "adaptive" and (self.draft_topk != 1 or self.draft_tokens not in (None, self.draft_steps + 1)):
            raise ValueError("adaptive speculation switches chains: draft_topk must be 1 and draft_tokens unset")
        if self.speculative_arms is not None:
            arms = self.speculative_arms
            if self.speculative != "adaptive":
                raise ValueError("speculative_arms needs speculative=adaptive")
            if (not arms and not self.history_arms) or len(set(arms)) != len(arms) or not all(0 <= a <= self.draft_steps for a in arms):
                raise ValueError(f"speculative_arms must be distinct draft lengths in 0..{self.draft_steps}, got {arms}")
        if self.history_arms:
            arms = self.history_arms
            if self.speculative != "adaptive":
                raise ValueError("history_arms needs speculative=adaptive")
            if len(set(arms)) != len(arms) or not all(1 <= a <= 16 for a in arms):
                raise ValueError(f"history_arms must be distinct draft lengths in 1..16, got {arms}")
        if self.draft_topk > 1 and self.draft_tokens is None:
            raise ValueError("a draft tree (draft_topk > 1) needs draft_tokens, the number of tokens to verify")
        if self.draft_topk == 1 and self.draft_tokens not in (None, self.draft_steps + 1):
            raise ValueError("a draft chain (draft_topk 1) verifies draft_steps + 1 tokens; leave draft_tokens unset")
        return self

