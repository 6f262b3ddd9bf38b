from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GrpoConfig(_message.Message):
    __slots__ = ("clip_low", "clip_high", "kl_coef", "normalize_std", "filter_zero_variance", "overlong", "overlong_buffer")
    CLIP_LOW_FIELD_NUMBER: _ClassVar[int]
    CLIP_HIGH_FIELD_NUMBER: _ClassVar[int]
    KL_COEF_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_STD_FIELD_NUMBER: _ClassVar[int]
    FILTER_ZERO_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_BUFFER_FIELD_NUMBER: _ClassVar[int]
    clip_low: float
    clip_high: float
    kl_coef: float
    normalize_std: bool
    filter_zero_variance: bool
    overlong: str
    overlong_buffer: int
    def __init__(self, clip_low: _Optional[float] = ..., clip_high: _Optional[float] = ..., kl_coef: _Optional[float] = ..., normalize_std: _Optional[bool] = ..., filter_zero_variance: _Optional[bool] = ..., overlong: _Optional[str] = ..., overlong_buffer: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "model_path", "task", "steps", "prompts_per_step", "samples_per_prompt", "max_new_tokens", "temperature", "lr", "updates_per_step", "tokens_per_micro_batch", "grpo", "seed", "drafter_path", "eval_every", "eval_problems", "dataset_path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    UPDATES_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_PATH_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    EVAL_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    DATASET_PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    model_path: str
    task: str
    steps: int
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    temperature: float
    lr: float
    updates_per_step: int
    tokens_per_micro_batch: int
    grpo: GrpoConfig
    seed: int
    drafter_path: str
    eval_every: int
    eval_problems: int
    dataset_path: str
    def __init__(self, name: _Optional[str] = ..., model_path: _Optional[str] = ..., task: _Optional[str] = ..., steps: _Optional[int] = ..., prompts_per_step: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., lr: _Optional[float] = ..., updates_per_step: _Optional[int] = ..., tokens_per_micro_batch: _Optional[int] = ..., grpo: _Optional[_Union[GrpoConfig, _Mapping]] = ..., seed: _Optional[int] = ..., drafter_path: _Optional[str] = ..., eval_every: _Optional[int] = ..., eval_problems: _Optional[int] = ..., dataset_path: _Optional[str] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("step", "policy_version", "reward_mean", "samples", "groups_used", "response_tokens", "rollout_s", "tail_s", "train_s", "publish_s", "loss", "clip_fraction", "spec_accept_length", "speculated_fraction", "resent", "stale_samples", "drafter_version", "eval_accuracy", "step_s", "samples_by_server")
    class SamplesByServerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_USED_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_S_FIELD_NUMBER: _ClassVar[int]
    TAIL_S_FIELD_NUMBER: _ClassVar[int]
    TRAIN_S_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SPEC_ACCEPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SPECULATED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    RESENT_FIELD_NUMBER: _ClassVar[int]
    STALE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    EVAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_BY_SERVER_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    reward_mean: float
    samples: int
    groups_used: int
    response_tokens: int
    rollout_s: float
    tail_s: float
    train_s: float
    publish_s: float
    loss: float
    clip_fraction: float
    spec_accept_length: float
    speculated_fraction: float
    resent: int
    stale_samples: int
    drafter_version: int
    eval_accuracy: float
    step_s: float
    samples_by_server: _containers.ScalarMap[str, int]
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., reward_mean: _Optional[float] = ..., samples: _Optional[int] = ..., groups_used: _Optional[int] = ..., response_tokens: _Optional[int] = ..., rollout_s: _Optional[float] = ..., tail_s: _Optional[float] = ..., train_s: _Optional[float] = ..., publish_s: _Optional[float] = ..., loss: _Optional[float] = ..., clip_fraction: _Optional[float] = ..., spec_accept_length: _Optional[float] = ..., speculated_fraction: _Optional[float] = ..., resent: _Optional[int] = ..., stale_samples: _Optional[int] = ..., drafter_version: _Optional[int] = ..., eval_accuracy: _Optional[float] = ..., step_s: _Optional[float] = ..., samples_by_server: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "spec", "state", "steps_done", "message", "created_at", "started_at", "finished_at", "last_step", "checkpoint", "resumed")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEPS_DONE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: JobSpec
    state: str
    steps_done: int
    message: str
    created_at: float
    started_at: float
    finished_at: float
    last_step: StepMetrics
    checkpoint: str
    resumed: int
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[str] = ..., steps_done: _Optional[int] = ..., message: _Optional[str] = ..., created_at: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., last_step: _Optional[_Union[StepMetrics, _Mapping]] = ..., checkpoint: _Optional[str] = ..., resumed: _Optional[int] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("state", "limit")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    state: str
    limit: int
    def __init__(self, state: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class JobList(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job_id", "after_event_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_event_id: str
    def __init__(self, job_id: _Optional[str] = ..., after_event_id: _Optional[str] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("state", "message", "steps_done", "eval_accuracy")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STEPS_DONE_FIELD_NUMBER: _ClassVar[int]
    EVAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    state: str
    message: str
    steps_done: int
    eval_accuracy: float
    def __init__(self, state: _Optional[str] = ..., message: _Optional[str] = ..., steps_done: _Optional[int] = ..., eval_accuracy: _Optional[float] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("event_id", "job_id", "time", "state", "step")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    job_id: str
    time: float
    state: StateChange
    step: StepMetrics
    def __init__(self, event_id: _Optional[str] = ..., job_id: _Optional[str] = ..., time: _Optional[float] = ..., state: _Optional[_Union[StateChange, _Mapping]] = ..., step: _Optional[_Union[StepMetrics, _Mapping]] = ...) -> None: ...
