"""The recorder that feeds the samples stream from SGLang's output path (fake requests, real Redis)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from rollout_server.sample_recorder import SampleRecorder
from tlt.local.redis_server import EmbeddedRedis
from tlt.store.connection import RedisSettings
from tlt.store.samples_stream import SamplesStream


class FINISH_ABORT:
    pass


class FINISH_LENGTH:
    pass


@dataclass
class FakeReq:
    """The part of SGLang's `Req` the recorder reads."""

    rid: str
    origin_input_ids: list[int]
    output_ids_through_stop: list[int]
    finished_reason: object | None = field(default_factory=FINISH_LENGTH)

    def finished(self) -> bool:
        return self.finished_reason is not None


def test_finished_requests_are_recorded_once_and_aborted_ones_not(redis_server) -> None:
    stream = SamplesStream(redis_server.settings.client(), f"rec-{uuid.uuid4().hex[:6]}")
    recorder = SampleRecorder(stream)
    done = FakeReq("a", [5, 6], [7, 1])
    running = FakeReq("b", [5], [8], finished_reason=None)
    aborted = FakeReq("c", [5], [9], finished_reason=FINISH_ABORT())
    probe = FakeReq("HEALTH_CHECK_1f2e", [0], [3])
    assert recorder.record_finished([done, running, aborted, probe]) == 1
    assert recorder.record_finished([done]) == 0  # streamed again later: not recorded twice
    running.finished_reason = FINISH_LENGTH()
    assert recorder.record_finished([running]) == 1
    assert [(r.prompt_ids, r.output_ids) for _, r in stream.read()] == [([5, 6], [7, 1]), ([5], [8])]


def test_samples_finished_while_redis_is_down_reach_it_once_it_is_back(tmp_path) -> None:
    redis_server = EmbeddedRedis(data_dir=tmp_path / "redis", log_path=tmp_path / "redis.log").start()
    try:
        client = RedisSettings(url=redis_server.settings.url, password=redis_server.password, retry_s=0).client()
        stream = SamplesStream(client, "job")
        recorder = SampleRecorder(stream, retry_s=0.0)
        assert recorder.record_finished([FakeReq("a", [5], [6])]) == 1
        redis_server.kill()
        assert recorder.record_finished([FakeReq("b", [5], [7])]) == 0  # never raises into the scheduler
        assert recorder.record_finished([FakeReq("c", [5], [8]), FakeReq("b", [5], [7])]) == 0
        redis_server.start()
        assert recorder.record_finished([FakeReq("d", [5], [9])]) == 3
        assert [r.output_ids for _, r in stream.read()] == [[6], [7], [8], [9]]
    finally:
        redis_server.stop()


def test_the_buffer_is_bounded_and_keeps_the_newest() -> None:
    unreachable = RedisSettings(url="redis://127.0.0.1:1/0", socket_timeout_s=0.5, retry_s=0).client()
    recorder = SampleRecorder(SamplesStream(unreachable, "job"), max_pending=2, retry_s=3600)
    assert recorder.record_finished([FakeReq(rid, [5], [n]) for n, rid in enumerate("abc")]) == 0
    assert [r.output_ids for r in recorder._pending] == [[1], [2]]
