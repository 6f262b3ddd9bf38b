"""The weight channel of DESIGN.md: versioned safetensors blobs in Redis, published by one writer
at a time and read by any number of readers that never see a partial version.

Layout, under `tlt:{job}:{kind}:` (kind `drafter` or `policy`):
- `blob:{blob_id}:{i}`  chunk i of a safetensors blob (staged with a TTL until committed),
- `manifest:{version}`  JSON `WeightManifest` (sha256, size, chunks, tensor index, parent, ...),
- `versions`            sorted set of live versions,
- `latest`              the newest committed version,
- channel `announce`    the new version number, published at commit.

Commit is one Lua script, so it is atomic: it checks that `latest` still equals the writer's parent
version (compare-and-set: of two writers trained from the same version exactly one wins), that
every chunk exists, then stores the manifest, moves `latest`, deletes versions beyond the newest
`keep` and announces. Readers check size and sha256 of what they assembled and raise `BadBlob`
rather than return anything else. Only safetensors and JSON cross the wire; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Literal

import redis
import torch
from pydantic import BaseModel, Field
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

WeightKind = Literal["drafter", "policy"]
# Manifest metadata of a policy version: the trainer's version number (the server's weight_version).
POLICY_VERSION_KEY = "policy_version"
# safetensors header: 8-byte little-endian length, then that many bytes of JSON.
_HEADER_LEN = struct.Struct("<Q")
MAX_HEADER_BYTES = 100 * 1024 * 1024

_COMMIT = """
local latest = redis.call('GET', KEYS[1])
if (ARGV[1] == '' and latest) or (ARGV[1] ~= '' and latest ~= ARGV[1]) then return -1 end
local prefix = ARGV[2]
for i = 0, tonumber(ARGV[5]) - 1 do
  local key = prefix .. 'blob:' .. ARGV[4] .. ':' .. i
  if redis.call('EXISTS', key) == 0 then return -2 end
end
for i = 0, tonumber(ARGV[5]) - 1 do redis.call('PERSIST', prefix .. 'blob:' .. ARGV[4] .. ':' .. i) end
local version = tonumber(ARGV[3])
redis.call('SET', prefix .. 'manifest:' .. version, ARGV[6])
redis.call('ZADD', KEYS[2], version, version)
redis.call('SET', KEYS[1], version)
local old = redis.call('ZRANGE', KEYS[2], 0, -(tonumber(ARGV[7]) + 1))
for _, v in ipairs(old) do
  local m = redis.call('GET', prefix .. 'manifest:' .. v)
  if m then
    local d = cjson.decode(m)
    for i = 0, d['chunks'] - 1 do redis.call('DEL', prefix .. 'blob:' .. d['blob_id'] .. ':' .. i) end
  end
  redis.call('DEL', prefix .. 'manifest:' .. v)
  redis.call('ZREM', KEYS[2], v)
end
redis.call('PUBLISH', prefix .. 'announce', version)
return version
"""


class BadBlob(Exception):
    """A version that is missing, incomplete, corrupt or not safetensors; keep the old weights."""


class CommitConflict(Exception):
    """Another writer committed since the parent version this one was built on."""


class TensorInfo(BaseModel):
    dtype: str
    shape: list[int]


class WeightManifest(BaseModel):
    """What a reader needs to fetch and verify one version."""

    job: str
    kind: WeightKind
    version: int = Field(ge=1)
    parent: int | None = Field(None, ge=1)
    blob_id: str
    size: int = Field(ge=0)
    sha256: str
    chunk_bytes: int = Field(ge=1)
    chunks: int = Field(ge=0)
    tensors: dict[str, TensorInfo]
    created_at: float
    metadata: dict[str, str] = Field(default_factory=dict)


def safetensors_index(blob: bytes) -> dict[str, TensorInfo]:
    """The tensor index of a safetensors blob; raises BadBlob when it is not one."""
    if len(blob) < _HEADER_LEN.size:
        raise BadBlob("not safetensors: shorter than its header length")
    (header_len,) = _HEADER_LEN.unpack_from(blob)
    if header_len > min(MAX_HEADER_BYTES, len(blob) - _HEADER_LEN.size):
        raise BadBlob("not safetensors: header length out of range")
    try:
        header = json.loads(blob[_HEADER_LEN.size : _HEADER_LEN.size + header_len])
        return {
            name: TensorInfo(dtype=info["dtype"], shape=info["shape"])
            for name, info in header.items()
            if name != "__metadata__"
        }
    except (ValueError, KeyError, TypeError) as err:
        raise BadBlob(f"not safetensors: bad header ({err})") from err


class WeightChannel:
    """One job's channel of one weight kind on a Redis server."""

    def __init__(
        self,
        client: redis.Redis,
        job: str,
        kind: WeightKind,
        chunk_bytes: int = 4 * 1024 * 1024,
        keep: int = 3,
        max_bytes: int = 8 * 1024**3,
        staging_ttl_s: int = 3600,
    ) -> None:
        if not job or ":" in job or "{" in job:
            raise ValueError("job ids are non-empty and contain no ':' or '{'")
        if keep < 1 or chunk_bytes < 1:
            raise ValueError("keep and chunk_bytes must be positive")
        self.client = client
        self.job, self.kind = job, kind
        self.prefix = f"tlt:{job}:{kind}:"
        self.chunk_bytes, self.keep, self.max_bytes, self.staging_ttl_s = chunk_bytes, keep, max_bytes, staging_ttl_s
        self._commit = client.register_script(_COMMIT)

    @property
    def announce_channel(self) -> str:
        return self.prefix + "announce"

    def _chunk_key(self, blob_id: str, index: int) -> str:
        return f"{self.prefix}blob:{blob_id}:{index}"

    def latest_version(self) -> int | None:
        """The newest committed version, or None before the first."""
        value = self.client.get(self.prefix + "latest")
        return int(value) if value is not None else None

    def versions(self) -> list[int]:
        """Live (not garbage-collected) versions, oldest first."""
        return [int(v) for v in self.client.zrange(self.prefix + "versions", 0, -1)]

    def manifest(self, version: int) -> WeightManifest | None:
        raw = self.client.get(f"{self.prefix}manifest:{version}")
        return WeightManifest.model_validate_json(raw) if raw is not None else None

    def publish(
        self, tensors: dict[str, torch.Tensor], parent: int | None, metadata: dict[str, str] | None = None
    ) -> WeightManifest:
        """Publish tensors as the version after `parent` (None: the first version)."""
        contiguous = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
        return self.publish_blob(save_safetensors(contiguous), parent, metadata)

    def publish_blob(self, blob: bytes, parent: int | None, metadata: dict[str, str] | None = None) -> WeightManifest:
        """Publish a safetensors blob; raises CommitConflict when `parent` is no longer the latest."""
        if len(blob) > self.max_bytes:
            raise BadBlob(f"blob of {len(blob)} bytes exceeds the channel's limit of {self.max_bytes}")
        tensors = safetensors_index(blob)
        blob_id = uuid.uuid4().hex
        chunks = (len(blob) + self.chunk_bytes - 1) // self.chunk_bytes
        manifest = WeightManifest(
            job=self.job,
            kind=self.kind,
            version=(parent or 0) + 1,
            parent=parent,
            blob_id=blob_id,
            size=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(),
            chunk_bytes=self.chunk_bytes,
            chunks=chunks,
            tensors=tensors,
            created_at=time.time(),
            metadata=metadata or {},
        )
        pipe = self.client.pipeline(transaction=False)
        for i in range(chunks):
            chunk = blob[i * self.chunk_bytes : (i + 1) * self.chunk_bytes]
            pipe.set(self._chunk_key(blob_id, i), chunk, ex=self.staging_ttl_s)
        pipe.execute()
        result = self._commit(
            keys=[self.prefix + "latest", self.prefix + "versions"],
            args=[
                "" if parent is None else str(parent),
                self.prefix,
                manifest.version,
                blob_id,
                chunks,
                manifest.model_dump_json(),
                self.keep,
            ],
        )
        if result < 0:
            self.client.delete(*[self._chunk_key(blob_id, i) for i in range(chunks)] or ["-"])
            if result == -1:
                raise CommitConflict(f"{self.kind} of job {self.job}: version {parent} is no longer the latest")
            raise BadBlob("chunks expired or vanished before the commit")
        return manifest

    def read(self, version: int | None = None) -> tuple[WeightManifest, bytes]:
        """The verified blob of `version` (default: the latest); raises BadBlob otherwise."""
        version = self.latest_version() if version is None else version
        if version is None:
            raise BadBlob(f"no {self.kind} version published for job {self.job}")
        manifest = self.manifest(version)
        if manifest is None:
            raise BadBlob(f"{self.kind} version {version} has no manifest (never committed or collected)")
        if manifest.size > self.max_bytes:
            raise BadBlob(f"{self.kind} version {version} is larger than this reader's limit")
        parts = self.client.mget([self._chunk_key(manifest.blob_id, i) for i in range(manifest.chunks)]) if manifest.chunks else []
        if any(part is None for part in parts):
            raise BadBlob(f"{self.kind} version {version} is missing chunks")
        blob = b"".join(parts)
        if len(blob) != manifest.size:
            raise BadBlob(f"{self.kind} version {version}: {len(blob)} bytes, manifest says {manifest.size}")
        if hashlib.sha256(blob).hexdigest() != manifest.sha256:
            raise BadBlob(f"{self.kind} version {version}: sha256 mismatch")
        if safetensors_index(blob) != manifest.tensors:
            raise BadBlob(f"{self.kind} version {version}: tensor index differs from the manifest")
        return manifest, blob

    def load(self, version: int | None = None) -> tuple[WeightManifest, dict[str, torch.Tensor]]:
        """The verified tensors of `version` (default: the latest)."""
        manifest, blob = self.read(version)
        try:
            return manifest, load_safetensors(blob)
        except Exception as err:  # safetensors raises its own error types for malformed data
            raise BadBlob(f"{self.kind} version {manifest.version}: {err}") from err

    def announcements(self, timeout_s: float | None = None) -> Iterator[int]:
        """Versions as they are announced (pub/sub); stops after `timeout_s` of silence."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.announce_channel)
        last = time.monotonic()
        try:
            while timeout_s is None or time.monotonic() - last < timeout_s:
                # None also comes back for the (ignored) subscription confirmation: poll on.
                message = pubsub.get_message(timeout=0.1)
                if message is not None and message["type"] == "message":
                    last = time.monotonic()
                    yield int(message["data"])
        finally:
            pubsub.close()
