"""Settings of `python -m rollout_server.policy_follower`, the sidecar that loads policy versions
from the job's Redis policy channel into its rollout server."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from tlt.settings.common import NAME_PATTERN, process_flags


class PolicyFollowerSettings(BaseSettings):
    """Flags of `python -m rollout_server.policy_follower` (also `TLT_FOLLOWER_*`; Redis: `TLT_REDIS_*`)."""

    model_config = process_flags("TLT_FOLLOWER_", "python -m rollout_server.policy_follower")

    server_url: str = Field(description="the rollout server this follower loads versions into")
    job_id: str = Field(pattern=NAME_PATTERN)
    base_model_path: Path = Field(description="the server's initial checkpoint: config and tokenizer files come from it")
    work_dir: Path = Field(description="where versions are written for the server to load (the newest 2 kept)")
    max_bytes: int = Field(8 * 1024**3, ge=1024, description="largest policy blob accepted")
