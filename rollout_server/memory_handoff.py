"""Hands an idle rollout server's KV cache to the spot worker for a slice's training and back.

On a GPU SGLang holds most of the memory for its KV cache; a slice trains on the same GPU, so the
worker pauses generation (new requests then wait in the server's tokenizer manager, which the TLT
plugin counts in `/v1/loads` as waiting, so the worker still sees them and yields), releases the
KV cache (`/release_memory_occupation`, tag `kv_cache`; the weights stay, they are small next to
it and the next slice's features need them), and afterwards resumes the cache and generation.
It needs a server started with `--enable-memory-saver` on a GPU: SGLang's release synchronises
CUDA and kills a CPU server's scheduler, so the worker hands memory off only when the server says
it has a memory saver (`memory_saver_enabled`).

The hand-off moves through states, each noted in Redis (`HandOffMarker`) *before* the call that
reaches it, so that a worker killed anywhere leaves a note that covers what may have happened:

    pausing -> paused -> (load re-checked) -> releasing -> released -> resuming -> (cleared)

A restarted worker undoes what the note says (`recover_hand_off`) before anything else: from
pausing or paused it continues generation; from releasing, released or resuming it resumes the KV
cache, then continues. Resuming a cache that was never released would crash SGLang (KeyError in
its scheduler), so the TLT plugin makes release and resume idempotent (`plugin._idempotent_*`).
An in-place pause leaves a running batch where it is, and SGLang's release asserts an idle
scheduler (a failed assertion kills the server), so the load is checked again between pause and
release: a server that holds a request is given back at once (`ServerBusy`).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Self

import redis
import requests

from tlt.rollout.client import server_load

logger = logging.getLogger(__name__)

KV_CACHE_TAG = "kv_cache"
# The states of a hand-off, in order; from the third on the KV cache may be released.
STATES = ("pausing", "paused", "releasing", "released", "resuming")
_MEMORY_MAY_BE_RELEASED = STATES[2:]


class ServerBusy(Exception):
    """The paused server holds a request: it was given back instead of released."""


def memory_saver_enabled(server_url: str) -> bool:
    """Whether the server can give memory back (`--enable-memory-saver`), from `/get_server_info`."""
    info = requests.get(f"{server_url.rstrip('/')}/get_server_info", timeout=10).json()
    return bool(info.get("enable_memory_saver", False))


class HandOffMarker:
    """Redis key `tlt:{job}:handoff:{worker}`: the state of the worker's server's hand-off (one of
    `STATES`), absent when it serves normally."""

    def __init__(self, client: redis.Redis, job_id: str, worker_id: str) -> None:
        self.client, self.key = client, f"tlt:{job_id}:handoff:{worker_id}"

    def set(self, state: str) -> None:
        self.client.set(self.key, state)

    def get(self) -> str | None:
        value = self.client.get(self.key)
        return value.decode() if value is not None else None

    def clear(self) -> None:
        self.client.delete(self.key)


def recover_hand_off(server_url: str, marker: HandOffMarker) -> str | None:
    """Undo a hand-off a killed worker left behind (memory back, generation on); returns what was undone."""
    state = marker.get()
    if state is not None:
        logger.warning("spot worker: the server was left %s by a previous worker; giving it back", state)
        MemoryHandOff(server_url, release=state in _MEMORY_MAY_BE_RELEASED, marker=marker).give_back(state)
    return state


class MemoryHandOff:
    """`with MemoryHandOff(url):` the server is paused with its KV cache released; on exit (also on
    errors and preemption) the cache is restored and generation continues. `release=False` only
    pauses (what can run on a CPU server). With a `marker`, the hand-off is noted before it starts
    and forgotten once it is undone."""

    def __init__(self, server_url: str, release: bool = True, timeout_s: float = 60.0, marker: HandOffMarker | None = None) -> None:
        self.server_url, self.release, self.timeout_s = server_url.rstrip("/"), release, timeout_s
        self.marker = marker
        self.state: str | None = None

    def _post(self, path: str, body: dict) -> None:
        answer = requests.post(f"{self.server_url}{path}", json=body, timeout=self.timeout_s)
        answer.raise_for_status()

    def _enter_state(self, state: str) -> None:
        """Note the state before the call that reaches it (a crash right after leaves it noted)."""
        self.state = state
        if self.marker is not None:
            self.marker.set(state)

    def __enter__(self) -> Self:
        self._enter_state("pausing")
        # in_place: requests arriving now wait in the tokenizer manager (and count as load).
        self._post("/pause_generation", {"mode": "in_place"})
        self._enter_state("paused")
        if not self.release:
            return self
        try:
            if server_load(self.server_url, self.timeout_s) > 0:
                raise ServerBusy(f"{self.server_url} holds requests: not releasing its KV cache")
            self._enter_state("releasing")
            self._post("/release_memory_occupation", {"tags": [KV_CACHE_TAG]})
            self._enter_state("released")
        except BaseException:
            self.give_back()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.give_back()

    def give_back(self, state: str | None = None) -> None:
        """From `state` (default: where this hand-off got to): restore the KV cache when it may be
        released, continue generation, forget the note."""
        state = state or self.state
        if state in _MEMORY_MAY_BE_RELEASED:
            self._enter_state("resuming")
            self._post("/resume_memory_occupation", {"tags": [KV_CACHE_TAG]})
        self._post("/continue_generation", {})
        self.state = None
        if self.marker is not None:
            self.marker.clear()
