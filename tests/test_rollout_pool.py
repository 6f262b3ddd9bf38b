"""The rollout pool over real rollout server processes: a server added mid-batch gets work, a
server killed mid-batch has its requests re-sent, and every sample comes back exactly once and
equal to what one healthy server generates (greedy)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.rollout_batches import greedy_batch
from tlt.local.process import RolloutServerProcess
from tlt.paths import BUNDLED_MODEL
from tlt.rollout.pool import NoServers, RolloutPool

pytestmark = pytest.mark.slow


def test_servers_join_and_die_mid_batch_and_every_sample_comes_back_once(tmp_path: Path) -> None:
    batch = greedy_batch(48)
    a = RolloutServerProcess(BUNDLED_MODEL, tmp_path / "a.log")
    b = RolloutServerProcess(BUNDLED_MODEL, tmp_path / "b.log")
    with a.start(), b.start():
        reference, _ = RolloutPool(lambda: [b.url], max_concurrency=16).run(batch)
        servers = [a.url]
        done: list[str] = []
        lock = threading.Lock()

        def on_done(request, completion) -> None:
            with lock:
                done.append(request.key)
                if len(done) == 8:
                    servers.append(b.url)  # scaled up mid-batch
                if len(done) == 20:
                    a.kill()  # and a server dies with requests in flight (it stays listed: a stale endpoint)

        pool = RolloutPool(lambda: list(servers), max_concurrency=16)
        results, stats = pool.run(batch, on_done)
    print(f"completions by server: {stats.by_server}; re-sent {stats.resent}")
    assert sorted(done) == sorted(r.key for r in batch) and len(done) == len(set(done))
    assert {k: c.output_ids for k, c in results.items()} == {k: c.output_ids for k, c in reference.items()}
    assert all(len(c.logprobs) == 160 for c in results.values())
    assert stats.by_server.get(b.url, 0) > 0 and stats.resent > 0 and a.url in stats.failed_servers


def test_a_hung_server_is_routed_around_within_a_bounded_time(tmp_path: Path) -> None:
    """A server that stops answering but keeps its connections (SIGSTOP) is declared hung after
    three unanswered probes; its requests are re-sent and the batch completes, each sample once."""
    batch = greedy_batch(48)
    a = RolloutServerProcess(BUNDLED_MODEL, tmp_path / "a.log")
    b = RolloutServerProcess(BUNDLED_MODEL, tmp_path / "b.log")
    with a.start(), b.start():
        reference, _ = RolloutPool(lambda: [b.url], max_concurrency=16).run(batch)
        frozen_at: list[float] = []
        lock = threading.Lock()

        def on_done(request, completion) -> None:
            with lock:
                if not frozen_at:
                    a.freeze()  # hangs with requests in flight
                    frozen_at.append(time.monotonic())

        pool = RolloutPool(lambda: [a.url, b.url], max_concurrency=16, probe_interval_s=2.0)
        try:
            results, stats = pool.run(batch, on_done)
            finished = time.monotonic() - frozen_at[0]
        finally:
            a.thaw()
    print(f"A hung; batch finished {finished:.1f} s later; re-sent {stats.resent}; by server {stats.by_server}")
    assert {k: c.output_ids for k, c in results.items()} == {k: c.output_ids for k, c in reference.items()}
    assert sum(stats.by_server.values()) == 48 and stats.resent > 0 and a.url in stats.failed_servers
    assert finished < 60  # three 2 s probes, each waiting up to 2 s, then the re-sent requests


def test_no_server_is_a_clear_error() -> None:
    pool = RolloutPool(lambda: ["http://127.0.0.1:9"], no_server_timeout_s=1.0)
    with pytest.raises(NoServers, match="no live rollout server"):
        pool.run(greedy_batch(1))


def test_keys_must_be_unique() -> None:
    request = greedy_batch(1)[0]
    with pytest.raises(ValueError, match="unique"):
        RolloutPool(list).run([request, request])
