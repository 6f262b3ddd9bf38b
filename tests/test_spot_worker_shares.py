"""The spot workers of one job split its samples by id among the workers on the progress board: a
worker alone trains on all of them, two train on disjoint shares that cover the window (and both
measure on all the held-out ones), and a worker that stops leaves the board at once, its share
going back to the other."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rollout_server.spot_worker import SpotWorker, SpotWorkerConfig
from tests.processes import until
from tlt.drafter.continual import is_held_out
from tlt.paths import BUNDLED_MODEL
from tlt.store.samples_stream import SampleRecord, SamplesStream
from tlt.store.spot_progress import SpotProgressBoard
from tlt.store.weight_channel import WeightChannel

JOB = "shares"


def _worker(client, worker_id: str, split: bool = True) -> SpotWorker:
    config = SpotWorkerConfig(job_id=JOB, worker_id=worker_id, policy_path=str(BUNDLED_MODEL), split_samples=split)
    return SpotWorker(config, WeightChannel(client, JOB, "drafter"), SamplesStream(client, JOB), None, lambda: True)


@contextmanager
def _polling(worker: SpotWorker) -> Iterator[None]:
    """The worker's loop, its server always busy: it is on the board and never starts a slice."""
    loop = threading.Thread(target=worker.run_forever, kwargs={"poll_s": 0.05}, daemon=True)
    loop.start()
    try:
        yield
    finally:
        worker.stop()
        loop.join(10)
        assert not loop.is_alive()


def _ids(window) -> set[str]:
    return {sample.sample_id for sample in window}


def test_workers_of_a_job_train_on_disjoint_shares_of_its_samples(redis_server) -> None:
    client = redis_server.settings.client()
    SamplesStream(client, JOB).add_many([SampleRecord(prompt_ids=[5, 6], output_ids=[7, n % 50 + 8, 1]) for n in range(60)])
    board = SpotProgressBoard(client, JOB)
    first, second = _worker(client, "rollout-0"), _worker(client, "rollout-1")
    with _polling(first):
        until(lambda: [p.worker_id for p in board.read()] == ["rollout-0"], 20, "the first worker on the board", 0.05)
        everything = _ids(first.refresh_window())
        assert len(everything) == 60
        held = {i for i in everything if is_held_out(i, first.config.continual.eval_fraction)}
        assert 0 < len(held) < 30
        with _polling(second):
            until(lambda: len(board.read()) == 2, 20, "both workers on the board", 0.05)
            shares = _ids(first.refresh_window()), _ids(second.refresh_window())
            assert shares[0] & shares[1] == held  # every worker measures on every held-out sample
            trained = shares[0] - held, shares[1] - held
            assert trained[0] | trained[1] == everything - held and not trained[0] & trained[1]
            assert min(map(len, trained)) >= 12  # even, up to the hash's spread
            assert {s.sample_id for s in first.training.missing_features()} == shares[0]
            assert _ids(_worker(client, "rollout-2", split=False).refresh_window()) == everything
        assert [p.worker_id for p in board.read()] == ["rollout-0"]  # removed when it stopped
        assert _ids(first.refresh_window()) == everything
    assert board.read() == []
