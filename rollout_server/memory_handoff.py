"""Hands an idle rollout server's KV cache to the spot worker for a slice's training and back.

On a GPU SGLang holds most of the memory for its KV cache; a slice trains on the same GPU, so the
worker pauses generation (new requests then wait in the server's tokenizer manager, which the TLT
plugin counts in `/v1/loads` as waiting, so the worker still sees them and yields), releases the
KV cache (`/release_memory_occupation`, tag `kv_cache`; the weights stay, they are small next to
it and the next slice's features need them), and afterwards resumes the cache and generation.
It needs a server started with `--enable-memory-saver` on a GPU: SGLang's release synchronises
CUDA and kills a CPU server's scheduler, so the worker hands memory off only when the server says
it has a memory saver (`memory_saver_enabled`).

A worker killed inside a hand-off would leave its server paused for good, so the hand-off is noted
in Redis first (`HandOffMarker`) and a restarted worker undoes what the note says
(`recover_hand_off`) before anything else.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Self

import redis
import requests

logger = logging.getLogger(__name__)

KV_CACHE_TAG = "kv_cache"


def memory_saver_enabled(server_url: str) -> bool:
    """Whether the server can give memory back (`--enable-memory-saver`), from `/get_server_info`."""
    info = requests.get(f"{server_url.rstrip('/')}/get_server_info", timeout=10).json()
    return bool(info.get("enable_memory_saver", False))


class HandOffMarker:
    """Redis key `tlt:{job}:handoff:{worker}`: what the worker's server is handed off for now
    ("paused" or "released"), absent when it serves normally."""

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
        MemoryHandOff(server_url, release=state == "released", marker=marker).give_back()
    return state


class MemoryHandOff:
    """`with MemoryHandOff(url):` the server is paused with its KV cache released; on exit (also on
    errors and preemption) the cache is restored and generation continues. `release=False` only
    pauses (what can run on a CPU server). With a `marker`, the hand-off is noted before it starts
    and forgotten once it is undone."""

    def __init__(self, server_url: str, release: bool = True, timeout_s: float = 60.0, marker: HandOffMarker | None = None) -> None:
        self.server_url, self.release, self.timeout_s = server_url.rstrip("/"), release, timeout_s
        self.marker = marker

    def _post(self, path: str, body: dict) -> None:
        answer = requests.post(f"{self.server_url}{path}", json=body, timeout=self.timeout_s)
        answer.raise_for_status()

    def __enter__(self) -> Self:
        if self.marker is not None:
            self.marker.set("released" if self.release else "paused")
        # in_place: nothing runs (the worker only starts on an idle server); requests arriving now wait.
        self._post("/pause_generation", {"mode": "in_place"})
        if not self.release:
            return self
        try:
            self._post("/release_memory_occupation", {"tags": [KV_CACHE_TAG]})
        except BaseException:
            self._post("/continue_generation", {})
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.give_back()

    def give_back(self) -> None:
        """Restore the KV cache (when released), continue generation, forget the note."""
        try:
            if self.release:
                self._post("/resume_memory_occupation", {"tags": [KV_CACHE_TAG]})
        finally:
            self._post("/continue_generation", {})
        if self.marker is not None:
            self.marker.clear()
