"""The spot worker outlives outages: Redis killed under its loop for longer than its client's
retries (it reads the samples stream again once Redis is back), and the drafter service killed
when a candidate is ready (committed once the service is back)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout_server.spot_worker import SpotWorker, SpotWorkerConfig, spot_training
from tlt.drafter.continual import ContinualConfig
from tlt.local.process import GrpcServiceProcess
from tlt.local.redis_server import EmbeddedRedis
from tlt.paths import BUNDLED_MODEL
from tlt.store.connection import RedisSettings
from tlt.store.samples_stream import SampleRecord, SamplesStream
from tlt.store.update_window import UpdateSlots, UpdateWindow
from tlt.store.weight_channel import WeightChannel
from tlt.tasks import GcdTask
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc


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


def test_a_candidate_ready_while_the_drafter_service_is_down_is_committed_once_it_is_back(redis_server, tmp_path) -> None:
    """The worker trains and measures with the service killed; the commit fails; the service comes
    back and the next slice commits the same candidate without training it again."""
    job = "outage-service"
    client = redis_server.settings.client()
    policy = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    torch.manual_seed(0)
    samples = SamplesStream(client, job)
    for problem in GcdTask().sample(64, seed=3, split="train"):
        prompt = tokenizer(problem.prompt).input_ids
        out = policy.generate(torch.tensor([prompt]), max_new_tokens=160, do_sample=True, temperature=1.0, pad_token_id=0)
        samples.add(SampleRecord(prompt_ids=prompt, output_ids=out[0, len(prompt) :].tolist()))
    service = GrpcServiceProcess("drafter_service", tmp_path / "service.log", env=redis_server.client_env()).start(60)
    try:
        with grpc.insecure_channel(service.target) as channel:
            stub = drafter_pb2_grpc.DrafterServiceStub(channel)
            stub.RegisterDrafter(pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL)))  # fresh: v1
            config = SpotWorkerConfig(
                job_id=job, worker_id="w", policy_path=str(BUNDLED_MODEL), training=spot_training(epochs=4, lr=3e-3),
                continual=ContinualConfig(held_out=16, eval_steps=6),
            )  # fmt: skip
            worker = SpotWorker(config, WeightChannel(client, job, "drafter"), samples, stub, lambda: False)
            service.kill()
            with pytest.raises(grpc.RpcError):
                worker.run_slice()
            trained = worker.training.steps
            assert trained > 0
            service.start(60)
            result = worker.run_slice()
            assert result.version == 2 and result.steps == 0 and worker.training.steps == trained
            assert result.accept_length > result.accept_length_before
    finally:
        service.stop()


def test_the_update_window_is_open_exactly_while_the_trainer_marks_it(redis_server) -> None:
    window = UpdateWindow(redis_server.settings.client(), "window-job")
    assert not window.is_open()
    with pytest.raises(RuntimeError), window.marked():
        assert window.is_open() and UpdateWindow(redis_server.settings.client(), "window-job").is_open()
        assert not UpdateWindow(redis_server.settings.client(), "other-job").is_open()
        raise RuntimeError("the update failed")
    assert not window.is_open()  # closed even when the update raised


def test_inside_the_update_window_only_the_slot_holders_work(redis_server) -> None:
    client = redis_server.settings.client()
    window = UpdateWindow(client, "slots-job")
    first, second = UpdateSlots(client, "slots-job", 1), UpdateSlots(client, "slots-job", 1)
    assert first.allowed() and second.allowed()  # outside the window: everyone
    with window.marked():
        assert first.allowed() and not second.allowed()
        assert first.allowed() and not second.allowed()  # kept while asked for
        first.release()
        assert second.allowed() and not first.allowed()
        assert UpdateSlots(client, "slots-job", 2).allowed()  # a second slot
        assert not UpdateSlots(client, "slots-job", 0).allowed()
        expiring = UpdateSlots(client, "other-job", 1, ttl_s=0.2)
        late = UpdateSlots(client, "other-job", 1)
        with UpdateWindow(client, "other-job").marked():
            assert expiring.allowed() and not late.allowed()
            time.sleep(0.4)  # its holder stopped asking (killed): the slot frees itself
            assert late.allowed() and not expiring.allowed()
    assert second.allowed() and not client.exists("tlt:slots-job:trainer:update-slot:0")  # the window closed: given back
