"""Rollouts spread over the live rollout servers: each sample is one request with a key of its own,
sent to the server with the fewest requests in flight among those discovery lists; a request whose
server fails (connection refused or reset, HTTP 5xx, timeout) or hangs (stops answering its load
probes while holding requests) is re-sent elsewhere, and every key is answered exactly once.
Discovery is asked again before each dispatch, so servers added or removed mid-step are picked up
(a static list on one machine, EndpointSlices on Kubernetes)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import requests

from tlt.rollout.client import Completion, SamplingParams, parse_completion, server_load
from tlt.rpc.errors import Cancelled

logger = logging.getLogger(__name__)


class NoServers(RuntimeError):
    """No live rollout server for longer than the pool waits."""


class ServerHung(RuntimeError):
    """The server holding a request stopped answering its probes."""


@dataclass(frozen=True)
class RolloutRequest:
    """One sample: `key` names it (unique in a step), `group` is its prompt's group."""

    key: str
    group: int
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int | None = None  # SGLang's sampling_seed (a re-send repeats the tokens only without adaptive SD)


@dataclass
class PoolStats:
    """What a `run` did: completions per server and requests re-sent after a failure."""

    by_server: dict[str, int] = field(default_factory=dict)
    resent: int = 0
    failed_servers: set[str] = field(default_factory=set)


class RolloutPool:
    """Runs batches of rollout requests over the servers `discover()` returns (base URLs)."""

    def __init__(
        self,
        discover: Callable[[], Sequence[str]],
        request_timeout_s: float = 900.0,
        no_server_timeout_s: float = 120.0,
        max_concurrency: int = 256,
        return_logprob: bool = True,
        rid_prefix: str = "",
        admit: Callable[[str], bool] = lambda url: True,
        probe_interval_s: float = 5.0,
        stall_probes: int = 3,
    ) -> None:
        self.discover, self.request_timeout_s, self.rid_prefix = discover, request_timeout_s, rid_prefix
        self.admit = admit  # e.g. the trainer's version barrier: a server must serve the current policy
        # A server whose load endpoint stops answering `stall_probes` times in a row while it holds
        # requests is hung (alive but silent): its requests are re-sent, it gets no work until it answers.
        self.probe_interval_s, self.stall_probes = probe_interval_s, stall_probes
        self._stalls: dict[str, int] = {}
        self._hung: set[str] = set()
        self.no_server_timeout_s, self.max_concurrency, self.return_logprob = no_server_timeout_s, max_concurrency, return_logprob
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._failed: dict[str, float] = {}  # url -> when it failed; skipped for a while
        self._requests: dict[str, str] = {}  # rid -> url of the requests in flight
        self._cancelled = threading.Event()
        self._session = requests.Session()

    def _live(self, servers: Sequence[str]) -> list[str]:
        """Discovered servers that did not fail in the last 5 s and are admitted (a refusal counts as
        a failure, so an unready server is not asked again at every pick)."""
        with self._lock:
            now = time.monotonic()
            candidates = [s for s in servers if now - self._failed.get(s, -1e9) > 5.0 and s not in self._hung]
        live = []
        for url in candidates:
            if self.admit(url):
                live.append(url)
            else:
                with self._lock:
                    self._failed[url] = time.monotonic()
        return live

    def _pick(self) -> str:
        deadline = time.monotonic() + self.no_server_timeout_s
        while True:
            if self._cancelled.is_set():
                raise Cancelled("rollouts cancelled")
            servers = list(self.discover())
            live = self._live(servers)
            with self._lock:
                live = [s for s in live if time.monotonic() - self._failed.get(s, -1e9) > 5.0]
                if live:
                    url = min(live, key=lambda s: self._in_flight.get(s, 0))
                    self._in_flight[url] = self._in_flight.get(url, 0) + 1
                    return url
            if time.monotonic() > deadline:
                raise NoServers(f"no live rollout server for {self.no_server_timeout_s:.0f} s (discovered: {servers})")
            time.sleep(0.2)

    def _generate(self, url: str, request: RolloutRequest, attempt: int) -> Completion:
        params = request.params.model_dump()
        if request.seed is not None:
            params["sampling_seed"] = request.seed
        # A re-sent request gets a new id: its first attempt may still be on a hung server.
        rid = f"{self.rid_prefix}{request.key}" + (f"#{attempt}" if attempt else "")
        body = {"rid": rid, "input_ids": list(request.prompt_ids), "sampling_params": params, "return_logprob": self.return_logprob}
        with self._lock:
            if self._cancelled.is_set():
                raise Cancelled("rollouts cancelled")
            self._requests[rid] = url
        try:
            answer = self._session.post(f"{url}/generate", json=body, timeout=self.request_timeout_s)
        finally:
            with self._lock:
                self._requests.pop(rid, None)
        if self._cancelled.is_set():
            raise Cancelled("rollouts cancelled")
        if answer.status_code >= 500:
            raise requests.HTTPError(f"{url}: HTTP {answer.status_code}", response=answer)
        if answer.status_code >= 400:  # the request itself is bad: no other server would take it
            raise ValueError(f"rollout request {request.key} refused by {url}: {answer.text[:500]}")
        return parse_completion(answer.json())

    def _one(self, request: RolloutRequest, stats: PoolStats, calls: ThreadPoolExecutor) -> Completion:
        attempt = 0
        while True:
            url = self._pick()
            try:
                completion = self._wait(url, calls.submit(self._generate, url, request, attempt))
            # ChunkedEncodingError: the server died while its answer was on the wire (kill -9 mid-body).
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError, requests.Timeout, requests.HTTPError, ServerHung) as err:
                with self._lock:
                    self._failed[url] = time.monotonic()
                    stats.failed_servers.add(url)
                    stats.resent += 1
                logger.warning("rollout server %s failed on %s (%s); re-sending", url, request.key, type(err).__name__)
                attempt += 1
                continue
            finally:
                with self._lock:
                    self._in_flight[url] -= 1
            with self._lock:
                self._failed.pop(url, None)
                stats.by_server[url] = stats.by_server.get(url, 0) + 1
            return completion

    def _wait(self, url: str, call: Future[Completion]) -> Completion:
        """The call's completion, unless its server is found hung first (the call is abandoned:
        its answer, if it ever comes, is dropped)."""
        while True:
            try:
                return call.result(timeout=0.25)
            except TimeoutError:
                if url in self._hung:
                    raise (Cancelled("rollouts cancelled") if self._cancelled.is_set() else ServerHung(url)) from None

    def _watch(self, stop: threading.Event) -> None:
        """Probe the servers that hold requests (and the hung ones) every `probe_interval_s`."""
        while not stop.wait(self.probe_interval_s):
            with self._lock:
                servers = {url for url, n in self._in_flight.items() if n > 0} | set(self._hung)
            for url in servers:
                try:
                    server_load(url, timeout_s=self.probe_interval_s)
                    answered = True
                except requests.RequestException:
                    answered = False
                with self._lock:
                    self._stalls[url] = 0 if answered else self._stalls.get(url, 0) + 1
                    if answered and url in self._hung:
                        self._hung.discard(url)
                        logger.warning("rollout server %s answers again", url)
                    elif self._stalls[url] >= self.stall_probes and url not in self._hung:
                        self._hung.add(url)
                        logger.warning("rollout server %s hung (%d probes unanswered): re-sending its requests", url, self._stalls[url])

    def cancel(self) -> None:
        """Stop: `run` raises Cancelled, and the servers abort the requests in flight (freeing them
        for other work) instead of finishing them. Final for this pool."""
        with self._lock:
            self._cancelled.set()
            in_flight = dict(self._requests)
        for rid, url in in_flight.items():
            try:
                self._session.post(f"{url}/abort_request", json={"rid": rid}, timeout=10)
            except requests.RequestException as err:  # a dead server frees itself
                logger.warning("could not abort %s on %s: %s", rid, url, err)

    def run(
        self, batch: Sequence[RolloutRequest], on_done: Callable[[RolloutRequest, Completion], None] | None = None
    ) -> tuple[dict[str, Completion], PoolStats]:
        """Every request's completion by key (each exactly once), and what it took. Raises
        Cancelled once `cancel()` was called."""
        keys = [r.key for r in batch]
        if len(set(keys)) != len(keys):
            raise ValueError("rollout request keys must be unique within a batch")
        stats = PoolStats()
        results: dict[str, Completion] = {}

        def one(request: RolloutRequest) -> None:
            completion = self._one(request, stats, calls)
            with self._lock:
                results[request.key] = completion
            if on_done is not None:
                on_done(request, completion)

        workers = max(1, min(self.max_concurrency, len(batch)))
        watching = threading.Event()
        watchdog = threading.Thread(target=self._watch, args=(watching,), name="rollout-watchdog", daemon=True)
        watchdog.start()
        # Calls run on their own threads so that a call to a hung server can be abandoned; twice
        # the workers leave room for re-sent calls beside abandoned ones.
        calls = ThreadPoolExecutor(max_workers=2 * workers, thread_name_prefix="rollout-call")
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for future in [pool.submit(one, r) for r in batch]:
                    future.result()
        finally:
            watching.set()
            calls.shutdown(wait=False, cancel_futures=True)  # abandoned calls end on their own
        return results, stats
