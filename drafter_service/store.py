"""The drafter service's state in Redis: per job a record, the version history and at most one
spot-training lease; the weights themselves live in the job's drafter weight channel.

Keys under `tlt:{job}:drafter:` beside the channel's: `record` (JSON), `history` (list of JSON
`DrafterVersion`), `lease` (JSON, expiring with the lease: Redis' own TTL is the clock, so a
commit after expiry finds no lease and is refused).
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from pathlib import Path

import redis
import torch
from pydantic import BaseModel
from safetensors.torch import load_file

from tlt.rpc import drafter_api as api
from tlt.rpc.errors import AlreadyExists, FailedPrecondition, NotFound
from tlt.store.weight_channel import BadBlob, CommitConflict, WeightChannel, safetensors_index

EXPORT_PIECE_BYTES = 1024 * 1024

_RENEW = """
local v = redis.call('GET', KEYS[1])
if not v or cjson.decode(v)['lease_id'] ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
# A worker runs one slice at a time: a live lease in its own name is a killed incarnation's, and
# the restarted worker takes it over instead of waiting out its TTL.
_GRANT = """
local v = redis.call('GET', KEYS[1])
if v and cjson.decode(v)['worker_id'] ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
_CLAIM = """
local v = redis.call('GET', KEYS[1])
if not v or cjson.decode(v)['lease_id'] ~= ARGV[1] then return false end
redis.call('DEL', KEYS[1])
return v
"""


class Lease(BaseModel):
    lease_id: str
    job_id: str
    worker_id: str
    base_version: int
    expires_at: float


class DrafterVersion(BaseModel):
    version: int
    parent: int = 0
    accept_length: float = 0.0
    committed_by: str = ""
    created_at: float
    size_bytes: int


class DrafterRecord(BaseModel):
    job_id: str
    policy_path: str
    base_drafter_path: str
    config_json: str


class DrafterInfo(BaseModel):
    job_id: str
    policy_path: str
    latest_version: int
    history: list[DrafterVersion]
    active_lease_id: str


def checkpoint_files(request: api.RegisterDrafterRequest) -> tuple[str, dict[str, torch.Tensor]]:
    """(config.json text, tensors) of the base drafter, or of a fresh one built for the policy."""
    if request.base_drafter_path:
        base = Path(request.base_drafter_path)
        if not (base / "config.json").is_file() or not (base / "model.safetensors").is_file():
            raise ValueError("base_drafter_path: needs config.json and model.safetensors")
        return (base / "config.json").read_text(), load_file(str(base / "model.safetensors"))
    if not (Path(request.policy_path) / "config.json").is_file():
        raise ValueError("policy_path: no config.json (a fresh drafter is built from the policy's config)")
    from tlt.drafter.model import export_fresh_drafter

    with tempfile.TemporaryDirectory() as tmp:
        export_fresh_drafter(Path(request.policy_path), Path(tmp))
        return (Path(tmp) / "config.json").read_text(), load_file(str(Path(tmp) / "model.safetensors"))


class DrafterStore:
    """Register, lease, commit and export drafters; one instance per service process."""

    def __init__(self, client: redis.Redis, keep_versions: int = 5, lease_ttl_s: int = 30) -> None:
        self.client, self.keep_versions, self.lease_ttl_s = client, keep_versions, lease_ttl_s
        self._grant = client.register_script(_GRANT)
        self._renew = client.register_script(_RENEW)
        self._claim = client.register_script(_CLAIM)

    def _key(self, job: str, name: str) -> str:
        return f"tlt:{job}:drafter:{name}"

    def channel(self, job: str) -> WeightChannel:
        return WeightChannel(self.client, job, "drafter", keep=self.keep_versions)

    def record(self, job: str) -> DrafterRecord:
        """The job's registration (NotFound when there is none)."""
        raw = self.client.get(self._key(job, "record"))
        if raw is None:
            raise NotFound(f"no drafter registered for job {job}")
        return DrafterRecord.model_validate_json(raw)

    def register(self, request: api.RegisterDrafterRequest) -> DrafterInfo:
        """Register the job's drafter; repeating the same registration is a no-op."""
        existing = self.client.get(self._key(request.job_id, "record"))
        if existing is not None:
            record = DrafterRecord.model_validate_json(existing)
            if (record.policy_path, record.base_drafter_path) != (request.policy_path, request.base_drafter_path):
                raise AlreadyExists(f"job {request.job_id} has a drafter registered with other paths")
            return self.info(request.job_id)
        config_json, tensors = checkpoint_files(request)
        record = DrafterRecord(**request.model_dump(), config_json=config_json)
        if not self.client.set(self._key(request.job_id, "record"), record.model_dump_json(), nx=True):
            return self.register(request)  # registered concurrently: compare with that one
        manifest = self.channel(request.job_id).publish(tensors, parent=None)
        self._append_history(request.job_id, manifest.version, 0, 0.0, "register", manifest.size)
        return self.info(request.job_id)

    def _append_history(self, job: str, version: int, parent: int, accept: float, by: str, size: int) -> None:
        entry = DrafterVersion(version=version, parent=parent, accept_length=accept, committed_by=by, created_at=time.time(), size_bytes=size)
        self.client.rpush(self._key(job, "history"), entry.model_dump_json())

    def info(self, job: str) -> DrafterInfo:
        record = self.record(job)
        history = [DrafterVersion.model_validate_json(h) for h in self.client.lrange(self._key(job, "history"), 0, -1)]
        lease = self.client.get(self._key(job, "lease"))
        return DrafterInfo(
            job_id=job,
            policy_path=record.policy_path,
            latest_version=self.channel(job).latest_version() or 0,
            history=history,
            active_lease_id=json.loads(lease)["lease_id"] if lease else "",
        )

    def lease(self, request: api.LeaseRequest) -> Lease:
        """Grant the job's one spot-training slice, or refuse while another is live."""
        self.record(request.job_id)
        base = self.channel(request.job_id).latest_version()
        if base is None:
            raise FailedPrecondition(f"job {request.job_id}'s drafter has no weights yet")
        ttl = request.ttl_seconds or self.lease_ttl_s
        lease = Lease(
            lease_id=uuid.uuid4().hex,
            job_id=request.job_id,
            worker_id=request.worker_id,
            base_version=base,
            expires_at=time.time() + ttl,
        )
        if not self._grant(keys=[self._key(request.job_id, "lease")], args=[request.worker_id, lease.model_dump_json(), ttl * 1000]):
            raise FailedPrecondition(f"job {request.job_id}'s drafter is leased to another worker")
        return lease

    def heartbeat(self, ref: api.LeaseRef, ttl_s: int | None = None) -> Lease:
        """Extend a live lease; an expired or superseded one cannot be revived."""
        raw = self.client.get(self._key(ref.job_id, "lease"))
        if raw is None or json.loads(raw)["lease_id"] != ref.lease_id:
            raise FailedPrecondition(f"lease {ref.lease_id} has expired or was superseded")
        ttl = ttl_s or self.lease_ttl_s
        lease = Lease.model_validate_json(raw).model_copy(update={"expires_at": time.time() + ttl})
        if not self._renew(keys=[self._key(ref.job_id, "lease")], args=[ref.lease_id, lease.model_dump_json(), ttl * 1000]):
            raise FailedPrecondition(f"lease {ref.lease_id} has expired or was superseded")
        return lease

    def _end(self, ref: api.LeaseRef) -> Lease | None:
        raw = self._claim(keys=[self._key(ref.job_id, "lease")], args=[ref.lease_id])
        return Lease.model_validate_json(raw) if raw else None

    def release(self, ref: api.LeaseRef) -> bool:
        return self._end(ref) is not None

    def commit(self, request: api.CommitRequest) -> int:
        """Publish a slice's weights as the version after the lease's base; ends the lease."""
        channel = self.channel(request.job_id)
        tensors = safetensors_index(request.weights)  # BadBlob: not safetensors
        latest = channel.latest_version()
        if latest is not None:
            expected = channel.manifest(latest)
            if expected is not None and expected.tensors != tensors:
                raise BadBlob(f"weights: tensors differ from drafter v{latest}'s (names, dtypes or shapes)")
        lease = self._end(api.LeaseRef(lease_id=request.lease_id, job_id=request.job_id))
        if lease is None:
            raise FailedPrecondition(f"lease {request.lease_id} has expired or was superseded")
        try:
            manifest = channel.publish_blob(request.weights, parent=lease.base_version)
        except CommitConflict as err:
            raise CommitConflict(f"drafter v{lease.base_version} is no longer the latest: {err}") from err
        self._append_history(request.job_id, manifest.version, lease.base_version, request.accept_length, lease.worker_id, manifest.size)
        return manifest.version

    def export(self, request: api.ExportRequest):
        """(path, offset, piece, version) pieces of an SGLang-loadable checkpoint of a version."""
        record = self.record(request.job_id)
        try:
            manifest, blob = self.channel(request.job_id).read(request.version or None)
        except BadBlob as err:
            raise NotFound(str(err)) from err
        config = record.config_json.encode()
        yield "config.json", 0, config, manifest.version
        for offset in range(0, len(blob), EXPORT_PIECE_BYTES):
            yield "model.safetensors", offset, blob[offset : offset + EXPORT_PIECE_BYTES], manifest.version
