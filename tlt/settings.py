"""Settings of TLT's processes: one pydantic model per process, the single source of truth for its
flags, defaults and limits. Each is filled from the command line, then `TLT_*` environment
variables, then the defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16", "float16"]


def cuda_available() -> bool:
    """Whether a CUDA device is usable (imports torch lazily: the CLI must start fast)."""
    import torch

    return torch.cuda.is_available()


class RolloutServerSettings(BaseSettings):
    """Flags of `python -m rollout_server`: SGLang with the TLT plugin and TLT's defaults.

    Arguments after `--` go to SGLang unchanged (see `sglang serve --help`).
    """

    model_config = SettingsConfigDict(
        env_prefix="TLT_ROLLOUT_",
        cli_prog_name="python -m rollout_server",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="forbid",
    )

    model_path: Path = Field(description="HF-format checkpoint directory (config, safetensors, tokenizer)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(30000, ge=1, le=65535, description="HTTP port")
    device: Device = Field("auto", description="auto picks cuda when a GPU is visible, else cpu")
    dtype: DType = Field("auto", description="weights/activations dtype; auto = float32 on cpu")
    max_total_tokens: int | None = Field(
        None, ge=256, description="KV-cache size in tokens; default 65536 on cpu, SGLang's on gpu"
    )
    max_running_requests: int | None = Field(None, ge=1, le=65536, description="running batch cap")
    context_length: int | None = Field(None, ge=16, description="override the model's context length")
    mem_fraction_static: float | None = Field(
        None, gt=0.0, lt=1.0, description="GPU memory fraction for weights + KV cache (gpu only)"
    )
    random_seed: int | None = Field(None, ge=0, description="seed of SGLang's sampler")
    enable_return_hidden_states: bool = Field(False, description="allow return_hidden_states requests")
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
    log_level: Literal["debug", "info", "warning", "error"] = Field("warning", description="SGLang log level")
    sglang_args: list[str] = Field(
        default_factory=list, description="extra SGLang flags (on the command line: after `--`)"
    )

    @model_validator(mode="after")
    def _check_model_path(self) -> RolloutServerSettings:
        if not (self.model_path / "config.json").is_file():
            raise ValueError(f"model_path {self.model_path} has no config.json (expected an HF checkpoint)")
        return self

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        """The device to run on, with `auto` decided by whether CUDA is usable."""
        if self.device == "auto":
            return "cuda" if cuda_available() else "cpu"
        return self.device

    def sglang_argv(self) -> list[str]:
        """The SGLang command line these settings stand for."""
        device = self.resolved_device()
        argv = ["--model-path", str(self.model_path), "--host", self.host, "--port", str(self.port)]
        argv += ["--device", device, "--log-level", self.log_level]
        dtype = self.dtype
        if device == "cpu":
            # No AMX/CUDA kernels here: PyTorch attention and sampling, fp32 for exact HF parity.
            argv += ["--attention-backend", "torch_native", "--sampling-backend", "pytorch"]
            dtype = "float32" if dtype == "auto" else dtype
        argv += ["--dtype", dtype]
        max_total_tokens = self.max_total_tokens
        if max_total_tokens is None and device == "cpu":
            max_total_tokens = 65536
        optional = {
            "--max-total-tokens": max_total_tokens,
            "--max-running-requests": self.max_running_requests,
            "--context-length": self.context_length,
            "--mem-fraction-static": self.mem_fraction_static,
            "--random-seed": self.random_seed,
        }
        for flag, value in optional.items():
            if value is not None:
                argv += [flag, str(value)]
        if self.enable_return_hidden_states:
            argv.append("--enable-return-hidden-states")
        if self.sleep_on_idle:
            argv.append("--sleep-on-idle")
        if not self.warmup:
            argv.append("--skip-server-warmup")
        return argv + list(self.sglang_args)
