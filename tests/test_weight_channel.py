"""The Redis layer against a real redis-server: embedded server, weight channel, samples stream."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
import redis
import torch
from pydantic import ValidationError
from safetensors.torch import save as save_safetensors

from tlt.local.redis_server import EmbeddedRedis
from tlt.store.connection import RedisSettings
from tlt.store.samples_stream import SampleRecord, SamplesStream
from tlt.store.weight_channel import BadBlob, CommitConflict, WeightChannel


@pytest.fixture
def server(redis_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis_server


@pytest.fixture
def client(server: EmbeddedRedis) -> redis.Redis:
    return server.settings.client()


@pytest.fixture
def job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def _tensors(version: int) -> dict[str, torch.Tensor]:
    """Weights whose values name the version, so a mixed-up read is caught."""
    return {"fc.weight": torch.full((64, 32), float(version)), "layers.0.bias": torch.arange(10.0) + version}


def test_embedded_server_requires_its_password(server: EmbeddedRedis) -> None:
    assert server.settings.client().ping()
    with pytest.raises(redis.AuthenticationError):
        RedisSettings(url=server.settings.url, password="wrong").client().ping()
    with pytest.raises((redis.AuthenticationError, redis.ResponseError), match="(?i)auth"):
        RedisSettings(url=server.settings.url).client().set("x", 1)


def test_redis_settings_validate_the_url() -> None:
    with pytest.raises(ValidationError, match="redis://"):
        RedisSettings(url="http://localhost")


def test_round_trip_and_announcement(client: redis.Redis, job: str) -> None:
    channel = WeightChannel(client, job, "drafter", chunk_bytes=1000)
    announced: list[int] = []
    listener = threading.Thread(target=lambda: announced.extend(channel.announcements(timeout_s=2.0)))
    listener.start()
    threading.Event().wait(0.2)  # let the subscription land
    first = channel.publish(_tensors(1), parent=None, metadata={"accept_length": "3.1"})
    second = channel.publish(_tensors(2), parent=first.version)
    listener.join()
    assert (first.version, second.version) == (1, 2) and second.parent == 1
    assert first.chunks > 1, "the blob spans several chunks"
    manifest, tensors = channel.load()
    assert manifest.version == 2 and channel.latest_version() == 2
    for name, tensor in _tensors(2).items():
        assert torch.equal(tensors[name], tensor)
    assert channel.load(1)[0].metadata == {"accept_length": "3.1"}
    assert announced == [1, 2]


def test_racing_committers_from_the_same_parent_exactly_one_wins(client: redis.Redis, job: str) -> None:
    channel = WeightChannel(client, job, "drafter", chunk_bytes=512)
    base = channel.publish(_tensors(1), parent=None)
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def commit(i: int) -> None:
        writer = WeightChannel(client, job, "drafter", chunk_bytes=512)
        barrier.wait()
        try:
            writer.publish(_tensors(10 + i), parent=base.version)
            outcomes.append("won")
        except CommitConflict:
            outcomes.append("lost")

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost"] * 5 + ["won"]
    assert channel.latest_version() == 2
    # The losers cleaned up their staged chunks: only the two committed blobs remain.
    blobs = {key.split(b":")[4] for key in client.scan_iter(f"tlt:{job}:drafter:blob:*")}
    assert len(blobs) == 2


def test_garbage_collection_keeps_the_last_k_versions(client: redis.Redis, job: str) -> None:
    channel = WeightChannel(client, job, "policy", chunk_bytes=300, keep=2)
    parent = None
    for version in range(1, 6):
        parent = channel.publish(_tensors(version), parent=parent).version
    assert channel.versions() == [4, 5]
    with pytest.raises(BadBlob, match="no manifest"):
        channel.read(3)
    live_blobs = {key.split(b":")[4] for key in client.scan_iter(f"tlt:{job}:policy:blob:*")}
    assert live_blobs == {channel.manifest(4).blob_id.encode(), channel.manifest(5).blob_id.encode()}


def test_a_flipped_byte_or_a_missing_chunk_is_rejected(client: redis.Redis, job: str) -> None:
    channel = WeightChannel(client, job, "drafter", chunk_bytes=256)
    manifest = channel.publish(_tensors(1), parent=None)
    key = f"tlt:{job}:drafter:blob:{manifest.blob_id}:1"
    original = client.get(key)
    client.set(key, bytes([original[0] ^ 0x01]) + original[1:])
    with pytest.raises(BadBlob, match="sha256"):
        channel.load()
    client.set(key, original[:-1])
    with pytest.raises(BadBlob, match="bytes"):
        channel.load()
    client.delete(key)
    with pytest.raises(BadBlob, match="missing chunks"):
        channel.load()
    client.set(key, original)
    assert channel.load()[0].version == 1
    # Two chunks swapped (the header's and another): same bytes, same size, wrong order.
    other = f"tlt:{job}:drafter:blob:{manifest.blob_id}:0"
    second = client.get(other)
    client.mset({key: second, other: original})
    with pytest.raises(BadBlob, match="sha256|bytes"):
        channel.load()


def test_non_safetensors_and_oversized_payloads_are_refused(client: redis.Redis, job: str) -> None:
    channel = WeightChannel(client, job, "drafter", max_bytes=10_000)
    with pytest.raises(BadBlob, match="not safetensors"):
        channel.publish_blob(b"\x80\x04\x95 a pickle, say", parent=None)
    with pytest.raises(BadBlob, match="limit"):
        channel.publish_blob(save_safetensors({"w": torch.zeros(5000)}), parent=None)
    assert channel.latest_version() is None
    with pytest.raises(BadBlob, match="no drafter version"):
        channel.read()


def test_a_reader_never_sees_a_half_written_version(client: redis.Redis, job: str) -> None:
    writer = WeightChannel(client, job, "drafter", chunk_bytes=700, keep=2)
    parent = writer.publish(_tensors(1), parent=None).version
    stop = threading.Event()
    seen: list[int] = []
    errors: list[str] = []

    def read_loop() -> None:
        reader = WeightChannel(client, job, "drafter", chunk_bytes=700, keep=2)
        while not stop.is_set():
            try:
                manifest, tensors = reader.load()
            except BadBlob as err:  # the version was collected while being read: retry
                errors.append(str(err))
                continue
            if not torch.equal(tensors["fc.weight"], _tensors(manifest.version)["fc.weight"]):
                raise AssertionError(f"version {manifest.version} came back with another version's weights")
            seen.append(manifest.version)

    readers = [threading.Thread(target=read_loop) for _ in range(2)]
    for r in readers:
        r.start()
    for version in range(2, 40):
        parent = writer.publish(_tensors(version), parent=parent).version
    stop.set()
    for r in readers:
        r.join()
    assert seen and max(seen) >= 30
    assert all("missing chunks" in e or "no manifest" in e for e in errors)


def test_staged_chunks_of_an_uncommitted_writer_expire(client: redis.Redis, job: str) -> None:
    channel = WeightChannel(client, job, "drafter", staging_ttl_s=1)
    channel._commit = lambda **_: (_ for _ in ()).throw(ConnectionError("writer died before commit"))
    with pytest.raises(ConnectionError):
        channel.publish(_tensors(1), parent=None)
    keys = list(client.scan_iter(f"tlt:{job}:drafter:blob:*"))
    assert keys and all(0 < client.ttl(k) <= 1 for k in keys)


def test_samples_stream_appends_reads_and_caps(client: redis.Redis, job: str) -> None:
    stream = SamplesStream(client, job, maxlen=100)
    first = stream.add(SampleRecord(prompt_ids=[5, 6], output_ids=[7, 8, 1], policy_version=3))
    (entry_id, record), = stream.read()
    assert entry_id == first and record.output_ids == [7, 8, 1] and record.policy_version == 3
    for i in range(500):
        stream.add(SampleRecord(prompt_ids=[i + 2], output_ids=[]))
    assert 100 <= len(stream) < 500  # trimmed approximately, as XADD MAXLEN ~ does
    assert stream.read(after=first, count=5)[0][1].prompt_ids[0] >= 2
    with pytest.raises(ValidationError):
        SampleRecord(prompt_ids=[-1], output_ids=[])
    newest = stream.last_id()
    assert stream.count_after(newest, 10) == 0
    stream.add_many([SampleRecord(prompt_ids=[3], output_ids=[4]) for _ in range(3)])
    assert stream.count_after(newest, 10) == 3 and stream.count_after(newest, 2) == 2
    assert [r.prompt_ids for r in stream.latest(2)] == [[3], [3]]


def test_persistent_server_keeps_the_weights_across_a_restart(tmp_path: Path, job: str) -> None:
    with EmbeddedRedis(data_dir=tmp_path / "data", password="s3cret") as first:
        WeightChannel(first.settings.client(), job, "drafter").publish(_tensors(1), parent=None)
        port = first.port
    with EmbeddedRedis(data_dir=tmp_path / "data", password="s3cret", port=port) as second:
        manifest, tensors = WeightChannel(second.settings.client(), job, "drafter").load()
    assert manifest.version == 1 and torch.equal(tensors["fc.weight"], _tensors(1)["fc.weight"])


def test_a_started_server_is_not_started_again_by_with(tmp_path: Path) -> None:
    server = EmbeddedRedis(log_path=tmp_path / "redis.log").start()
    first = server.process
    with server:
        assert server.process is first
    assert first.poll() is not None
