from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterDrafterRequest(_message.Message):
    __slots__ = ("job_id", "policy_path", "base_drafter_path")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_PATH_FIELD_NUMBER: _ClassVar[int]
    BASE_DRAFTER_PATH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    policy_path: str
    base_drafter_path: str
    def __init__(self, job_id: _Optional[str] = ..., policy_path: _Optional[str] = ..., base_drafter_path: _Optional[str] = ...) -> None: ...

class DrafterRef(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DrafterVersion(_message.Message):
    __slots__ = ("version", "parent", "accept_length", "committed_by", "created_at", "size_bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    parent: int
    accept_length: float
    committed_by: str
    created_at: float
    size_bytes: int
    def __init__(self, version: _Optional[int] = ..., parent: _Optional[int] = ..., accept_length: _Optional[float] = ..., committed_by: _Optional[str] = ..., created_at: _Optional[float] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class DrafterInfo(_message.Message):
    __slots__ = ("job_id", "policy_path", "latest_version", "history", "active_lease_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_PATH_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    policy_path: str
    latest_version: int
    history: _containers.RepeatedCompositeFieldContainer[DrafterVersion]
    active_lease_id: str
    def __init__(self, job_id: _Optional[str] = ..., policy_path: _Optional[str] = ..., latest_version: _Optional[int] = ..., history: _Optional[_Iterable[_Union[DrafterVersion, _Mapping]]] = ..., active_lease_id: _Optional[str] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("job_id", "worker_id", "ttl_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: str
    ttl_seconds: int
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class LeaseGrant(_message.Message):
    __slots__ = ("lease_id", "job_id", "base_version", "expires_at")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    job_id: str
    base_version: int
    expires_at: float
    def __init__(self, lease_id: _Optional[str] = ..., job_id: _Optional[str] = ..., base_version: _Optional[int] = ..., expires_at: _Optional[float] = ...) -> None: ...

class LeaseRef(_message.Message):
    __slots__ = ("lease_id", "job_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    job_id: str
    def __init__(self, lease_id: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("lease_id", "job_id", "weights", "accept_length")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    job_id: str
    weights: bytes
    accept_length: float
    def __init__(self, lease_id: _Optional[str] = ..., job_id: _Optional[str] = ..., weights: _Optional[bytes] = ..., accept_length: _Optional[float] = ...) -> None: ...

class CommitResult(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ReleaseResult(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ExportRequest(_message.Message):
    __slots__ = ("job_id", "version")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ExportChunk(_message.Message):
    __slots__ = ("path", "offset", "data", "version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    data: bytes
    version: int
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class WarmupRequest(_message.Message):
    __slots__ = ("job_id", "dataset_path", "epochs", "max_samples", "eval_fraction")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_PATH_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EVAL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    dataset_path: str
    epochs: int
    max_samples: int
    eval_fraction: float
    def __init__(self, job_id: _Optional[str] = ..., dataset_path: _Optional[str] = ..., epochs: _Optional[int] = ..., max_samples: _Optional[int] = ..., eval_fraction: _Optional[float] = ...) -> None: ...

class WarmupProgress(_message.Message):
    __slots__ = ("phase", "step", "total", "loss", "accept_length_before", "accept_length", "version")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_LENGTH_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    phase: str
    step: int
    total: int
    loss: float
    accept_length_before: float
    accept_length: float
    version: int
    def __init__(self, phase: _Optional[str] = ..., step: _Optional[int] = ..., total: _Optional[int] = ..., loss: _Optional[float] = ..., accept_length_before: _Optional[float] = ..., accept_length: _Optional[float] = ..., version: _Optional[int] = ...) -> None: ...
