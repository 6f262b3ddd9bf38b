"""A job's record and events as the trainer persists them in Redis and clients read them: shared by
the trainer (which writes them) and the CLI (which shows them), converted to protobuf in
`tlt.jobs.proto`."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tlt.jobs.spec import JobSpec


class JobState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class StepMetrics(BaseModel):
    """One RL step: reward, where the time went, what speculation and the loss did."""

    model_config = ConfigDict(extra="forbid")

    step: int
    policy_version: int  # the version that generated this step's samples
    reward_mean: float
    samples: int
    groups_used: int  # groups with a non-zero advantage somewhere
    response_tokens: int
    rollout_s: float
    tail_s: float  # from 90% of the samples done to the last one
    train_s: float
    publish_s: float
    loss: float
    clip_fraction: float
    spec_accept_length: float  # tokens committed per speculative step (arm-0 steps left out); 0: none
    speculated_fraction: float  # share of response tokens committed by speculative steps (draft steps > 0)
    resent: int  # samples re-sent after a server failed
    stale_samples: int  # samples a server generated with another policy version than this step's
    drafter_version: int = 0  # the job's newest drafter version after the step; 0: no drafter service
    eval_accuracy: float = -1.0  # held-out accuracy after the step; -1: not evaluated
    step_s: float = 0.0
    samples_by_server: dict[str, int] = Field(default_factory=dict)  # rollout server URL -> samples


class JobRecord(BaseModel):
    """What Redis holds about a job (`tlt:{job}:job`)."""

    job_id: str
    spec: JobSpec
    state: JobState = JobState.QUEUED
    steps_done: int = 0
    message: str = ""
    created_at: float
    started_at: float = 0.0
    finished_at: float = 0.0
    last_step: StepMetrics | None = None
    checkpoint: str = ""
    resumed: int = 0
    cancel_requested: bool = False


class JobEvent(BaseModel):
    """One entry of a job's event stream: a state change or a finished step."""

    event_id: str = ""  # the Redis stream id, filled in when read
    job_id: str
    time: float
    state: JobState | None = None
    message: str = ""
    steps_done: int = Field(0, ge=0)
    eval_accuracy: float = -1.0  # with a state change: held-out accuracy at that point; -1: none
    step: StepMetrics | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobRef(_Request):
    job_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")


class ListJobsRequest(_Request):
    state: JobState | Literal[""] = ""
    limit: int = Field(0, ge=0, le=10_000, description="0: 100")


class WatchRequest(JobRef):
    after_event_id: str = Field("", pattern=r"^(\d{1,20}-\d{1,20})?$", description="a Redis stream id; empty: from the start")
