"""An RL job, as users write it (YAML for `tlt run JOB.yaml`, protobuf for JobService): the single
source of truth for its limits and defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tlt.paths import BUNDLED_MODEL

MAX_SAMPLES_PER_STEP = 65536


class GrpoConfig(BaseModel):
    """The loss and its options (defaults: DAPO's clip-higher, no KL, token-level mean)."""

    model_config = ConfigDict(extra="forbid")

    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ratio floor 1 - clip_low for negative advantages")
    clip_high: float = Field(0.28, ge=0.0, le=10.0, description="ratio ceiling 1 + clip_high for positive advantages")
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description="weight of the k3 KL estimate to the reference policy; 0: none")
    normalize_std: bool = Field(True, description="divide advantages by the group's std (off: Dr. GRPO)")
    filter_zero_variance: bool = Field(True, description="drop groups whose samples all got the same reward")
    overlong: Literal["keep", "filter", "penalty"] = Field(
        "filter", description="truncated responses: keep as is, mask out of the loss, or DAPO's soft length penalty"
    )
    overlong_buffer: int = Field(
        64, ge=1, le=65536, description="penalty: the last this many tokens before the limit cost up to 1 reward linearly"
    )


class JobSpec(BaseModel):
    """One GRPO job on the tiny task (or any HF checkpoint with the GCD task's prompts)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="job id: names its Redis keys and runs/<name>/")
    model_path: Path = Field(BUNDLED_MODEL, description="HF checkpoint of the initial policy")
    task: Literal["gcd", "jsonl"] = Field(
        "gcd", description="gcd: the tiny model's task; jsonl: math problems of dataset_path, final answers checked"
    )
    dataset_path: Path | None = Field(None, description="JSONL of {prompt, answer} rows (task jsonl)")
    steps: int = Field(20, ge=1, le=100_000)
    prompts_per_step: int = Field(32, ge=1, le=4096)
    samples_per_prompt: int = Field(8, ge=2, le=64, description="G: the group size")
    max_new_tokens: int = Field(512, ge=1, le=32768)
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW learning rate of the policy")
    updates_per_step: int = Field(1, ge=1, le=64, description="optimizer steps per RL step (mini-batches)")
    tokens_per_micro_batch: int = Field(16384, ge=256, le=10_000_000, description="gradient accumulation chunking")
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    seed: int = Field(0, ge=0, le=2**62)
    drafter_path: Path | None = Field(
        None, description="base EAGLE drafter (SGLang checkpoint) registered with the drafter service; none: a fresh one"
    )
    eval_every: int = Field(5, ge=0, le=100_000, description="held-out evaluation every this many steps and at the end; 0: never")
    eval_problems: int = Field(64, ge=1, le=100_000, description="held-out problems per evaluation (sampled at the job's temperature)")

    @model_validator(mode="after")
    def _dataset_for_jsonl(self) -> JobSpec:
        if (self.task == "jsonl") != (self.dataset_path is not None):
            raise ValueError("dataset_path is needed by task jsonl, and only by it")
        return self

    @model_validator(mode="after")
    def _bounded_batch(self) -> JobSpec:
        if self.prompts_per_step * self.samples_per_prompt > MAX_SAMPLES_PER_STEP:
            raise ValueError(f"prompts_per_step x samples_per_prompt must be at most {MAX_SAMPLES_PER_STEP}")
        return self

    @classmethod
    def from_yaml(cls, path: Path) -> JobSpec:
        """Load and validate a YAML job file (ValueError; pydantic's names the field); relative model,
        drafter and dataset paths are relative to the file."""
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise ValueError(f"{path} is not a YAML job file: {err}") from None
        if isinstance(data, dict):
            for key in ("model_path", "drafter_path", "dataset_path"):
                if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
                    data[key] = str((path.parent / data[key]).resolve())
        return cls.model_validate(data)
