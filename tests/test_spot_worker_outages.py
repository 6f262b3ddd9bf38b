"""The spot worker's loop outlives a Redis outage longer than its client's retries: killed under
it, Redis comes back and the worker reads the samples stream again."""

from __future__ import annotations

import threading
import time

from rollout_server.spot_worker import SpotWorker, SpotWorkerConfig
from tlt.local.redis_server import EmbeddedRedis
from tlt.paths import BUNDLED_MODEL
from tlt.store.connection import RedisSettings
from tlt.store.samples_stream import SamplesStream
from tlt.store.weight_channel import WeightChannel


def _wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_worker_keeps_polling_through_a_redis_outage(tmp_path) -> None:
    redis = EmbeddedRedis(log_path=tmp_path / "redis.log").start()
    try:
        client = RedisSettings(url=redis.settings.url, password=redis.settings.password, retry_s=0.3).client()
        samples = SamplesStream(client, "outage")
        outcomes: list[str] = []
        real_count = samples.count_after

        def counted(*args, **kwargs):
            try:
                value = real_count(*args, **kwargs)
            except Exception as err:
                outcomes.append(type(err).__name__)
                raise
            outcomes.append("ok")
            return value

        samples.count_after = counted
        config = SpotWorkerConfig(job_id="outage", worker_id="w", policy_path=str(BUNDLED_MODEL), idle_grace_s=0.0)
        worker = SpotWorker(config, WeightChannel(client, "outage", "drafter"), samples, None, lambda: False)
        loop = threading.Thread(target=worker.run_forever, kwargs={"poll_s": 0.05}, daemon=True)
        loop.start()
        _wait_for(lambda: "ok" in outcomes)
        redis.kill()
        _wait_for(lambda: outcomes[-1] != "ok")
        assert loop.is_alive()
        failed = len(outcomes)
        redis.start()
        _wait_for(lambda: outcomes[failed:].count("ok") > 0)
        assert loop.is_alive() and "ConnectionError" in outcomes
        worker.stop()
        loop.join(5)
        assert not loop.is_alive()
    finally:
        redis.stop()
