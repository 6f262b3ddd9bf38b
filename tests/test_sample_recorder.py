"""The recorder that feeds the samples stream from SGLang's output path (fake requests, real Redis)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from rollout_server.sample_recorder import SampleRecorder
from tlt.samples_stream import SamplesStream
from tlt.settings import RedisSettings


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


def test_a_redis_outage_loses_samples_but_never_raises() -> None:
    unreachable = RedisSettings(url="redis://127.0.0.1:1/0", socket_timeout_s=0.5).client()
    recorder = SampleRecorder(SamplesStream(unreachable, "job"))
    assert recorder.record_finished([FakeReq("a", [5], [6])]) == 0
