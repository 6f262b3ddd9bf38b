"""The KV-cache hand-off's state machine and its recovery from every state.

SGLang's memory release needs a GPU (it synchronises CUDA), so the server here is a stand-in at the
HTTP boundary that behaves as SGLang 0.5.23 does where it matters: release asserts an idle
scheduler and a resume of a tag never released raises KeyError; either kills a real server, which
the stand-in records as `crashed`. Its release/resume go through the TLT plugin's hooks, as the
real scheduler's do. The pause path itself runs against a real CPU server in test_spot_worker.py.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput, ResumeMemoryOccupationReqInput

from rollout_server import plugin
from rollout_server.memory_handoff import STATES, HandOffMarker, MemoryHandOff, ServerBusy, recover_hand_off


class FakeSGLang:
    """The endpoints a hand-off uses, with SGLang's failure modes."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.paused = False
        self.running = 0  # requests in the running batch (an in-place pause leaves them there)
        self.updater = SimpleNamespace(offload_tags=set())
        self.crashed: str | None = None
        self.fail_on: str | None = None  # a path answered with 500 (the call did not happen)

    def _release(self, updater, req):
        assert self.running == 0, "release_memory_occupation should be called only when server is idle."
        updater.offload_tags.update(req.tags)

    def _resume(self, updater, req):
        for tag in req.tags:
            updater.offload_tags.remove(tag)  # KeyError for a tag never released, as in SGLang

    def handle(self, path: str, body: dict) -> tuple[int, dict]:
        self.calls.append(path)
        if self.crashed:
            return 502, {}
        if path == self.fail_on:
            return 500, {}
        try:
            if path == "/pause_generation":
                self.paused = True
            elif path == "/continue_generation":
                self.paused = False
            elif path == "/release_memory_occupation":
                plugin._idempotent_release(self._release, self.updater, ReleaseMemoryOccupationReqInput(tags=body["tags"]))
            elif path == "/resume_memory_occupation":
                plugin._idempotent_resume(self._resume, self.updater, ResumeMemoryOccupationReqInput(tags=body["tags"]))
            elif path == "/v1/loads":
                return 200, {"loads": [{"num_running_reqs": self.running, "num_waiting_reqs": 0}]}
        except (AssertionError, KeyError) as err:  # the scheduler dies: SGLang sends SIGQUIT
            self.crashed = f"{type(err).__name__}: {err}"
            return 502, {}
        return 200, {"success": True}


@pytest.fixture
def sglang() -> Iterator[tuple[FakeSGLang, str]]:
    fake = FakeSGLang()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: dict) -> None:
            status, answer = fake.handle(self.path.split("?")[0], body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            self._answer(json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}"))

        def do_GET(self) -> None:
            self._answer({})

        def log_message(self, *_) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def marker(redis_server) -> HandOffMarker:
    return HandOffMarker(redis_server.settings.client(), f"job-{uuid.uuid4().hex[:8]}", "pod-a")


def test_a_hand_off_notes_each_state_before_its_call_and_gives_everything_back(sglang, marker) -> None:
    fake, url = sglang
    seen: list[tuple[str | None, str]] = []
    original = fake.handle
    fake.handle = lambda path, body: (seen.append((marker.get(), path)), original(path, body))[1]  # type: ignore[method-assign]
    with MemoryHandOff(url, marker=marker):
        assert fake.paused and fake.updater.offload_tags == {"kv_cache"} and marker.get() == "released"
    assert [s for s in seen if s[1] != "/v1/loads"] == [
        ("pausing", "/pause_generation"),
        ("releasing", "/release_memory_occupation"),
        ("resuming", "/resume_memory_occupation"),
        ("resuming", "/continue_generation"),
    ]
    assert not fake.paused and not fake.updater.offload_tags and marker.get() is None and fake.crashed is None


def test_a_batch_left_running_by_the_pause_is_not_released_under(sglang, marker) -> None:
    fake, url = sglang
    fake.running = 3
    with pytest.raises(ServerBusy), MemoryHandOff(url, marker=marker):
        pytest.fail("the slice must not train")
    assert "/release_memory_occupation" not in fake.calls and fake.crashed is None
    assert not fake.paused and marker.get() is None


def test_a_failed_release_continues_generation(sglang, marker) -> None:
    fake, url = sglang
    fake.fail_on = "/release_memory_occupation"
    with pytest.raises(Exception, match="500"), MemoryHandOff(url, marker=marker):
        pass
    assert not fake.paused and fake.crashed is None and marker.get() is None


# (state noted, whether the KV cache is released then): nothing is released before "releasing" is
# noted, "released" only after it was; from "releasing" on a successor cannot know, and need not.
LEFT_BEHIND = [("pausing", False), ("paused", False), ("releasing", False), ("releasing", True), ("released", True),
               ("resuming", True), ("resuming", False)]  # fmt: skip


def test_every_state_is_covered() -> None:
    assert {state for state, _ in LEFT_BEHIND} == set(STATES)


@pytest.mark.parametrize(("state", "released"), LEFT_BEHIND)
def test_a_successor_recovers_a_server_left_in_any_state(sglang, marker, state: str, released: bool) -> None:
    """A worker killed with the note at `state`, the KV cache `released` or not."""
    fake, url = sglang
    fake.paused = state != "pausing"
    if released:
        fake.updater.offload_tags.add("kv_cache")
    marker.set(state)
    assert recover_hand_off(url, marker) == state
    assert fake.crashed is None
    assert not fake.paused and not fake.updater.offload_tags and marker.get() is None


def test_without_the_plugin_a_blind_resume_would_kill_the_server(sglang) -> None:
    """What the idempotent resume prevents (SGLang's own behaviour, reproduced by the stand-in)."""
    fake, _ = sglang
    with pytest.raises(KeyError):
        fake._resume(fake.updater, ResumeMemoryOccupationReqInput(tags=["kv_cache"]))
    plugin._idempotent_release(fake._release, fake.updater, ReleaseMemoryOccupationReqInput(tags=["kv_cache"]))
    plugin._idempotent_release(fake._release, fake.updater, ReleaseMemoryOccupationReqInput(tags=["kv_cache"]))
    assert fake.updater.offload_tags == {"kv_cache"}
