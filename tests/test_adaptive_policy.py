"""The bandit behind SGLang's adaptive-policy interface: config file, step attribution under the
overlapped scheduler, idle gaps, metrics. The engine-independent learning is in test_bandit.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rollout_server import adaptive_policy
from rollout_server.adaptive_policy import BanditSpecPolicy, SpecMetrics, adaptive_config_file
from tlt.speculation.bandit import BanditConfig, SpecArm


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(adaptive_policy.time, "perf_counter", lambda: now[0])
    return now


def _policy(
    tmp_path: Path, steps=(0, 1, 2), registry: CollectorRegistry | None = None, synchronous: bool = False
) -> BanditSpecPolicy:
    config = BanditConfig(arms=[SpecArm(draft_steps=s) for s in steps])
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(adaptive_config_file(config)))
    metrics = SpecMetrics(registry or CollectorRegistry())
    return BanditSpecPolicy(max(steps), str(path), metrics=metrics, synchronous_launch=synchronous)


def test_config_file_gives_sglang_the_arms_and_the_policy_its_config(tmp_path: Path) -> None:
    content = adaptive_config_file(BanditConfig(arms=[SpecArm(draft_steps=s) for s in (3, 0, 1)], exploration=0.3))
    assert content["1"] == {"candidate_steps": [0, 1, 3]}  # what SGLang sizes its buffers from
    path = tmp_path / "a.json"
    path.write_text(json.dumps(content))
    policy = BanditSpecPolicy(initial_steps=3, cfg_path=str(path), metrics=SpecMetrics(CollectorRegistry()))
    assert policy.candidate_steps == [0, 1, 3]
    assert policy.bandit.config.exploration == 0.3
    assert policy.cuda_graph_bs_for_step(1) is None  # graphs off (the CPU)


def test_speculative_arms_capture_graphs_only_up_to_the_batch_they_may_run_at(tmp_path: Path) -> None:
    """Each runtime state captures draft, draft-extend and verify graphs at every size it gets:
    the speculative arms get the sizes up to `max_speculative_batch`, plain decoding all of them."""
    config = BanditConfig(arms=[SpecArm(draft_steps=s) for s in (0, 2, 4)], max_speculative_batch=48)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(adaptive_config_file(config)))
    policy = BanditSpecPolicy(initial_steps=4, cfg_path=str(path), metrics=SpecMetrics(CollectorRegistry()))
    sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 512, 1024]
    policy.set_cuda_graph_bs(sizes)
    assert policy.cuda_graph_bs_for_step(0) == sizes
    assert policy.cuda_graph_bs_for_step(2) == policy.cuda_graph_bs_for_step(4) == [1, 2, 4, 8, 16, 24, 32, 40, 48]
    policy.set_cuda_graph_bs([1, 2, 4, 8, 16, 32, 64, 128])  # 48 pads up to the graph of 64
    assert policy.cuda_graph_bs_for_step(4) == [1, 2, 4, 8, 16, 32, 64]
    assert {policy.get_steps_for_batch(b) for b in (49, 100, 1024)} == {0}  # never speculates above the cap


def test_tree_arms_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps(adaptive_config_file(BanditConfig(arms=[SpecArm(draft_steps=2, topk=2)]))))
    with pytest.raises(ValueError, match="topk 1"):
        BanditSpecPolicy(initial_steps=2, cfg_path=str(path))


def test_each_report_is_credited_to_the_step_it_reports_under_overlap(tmp_path: Path, clock: list[float]) -> None:
    policy = _policy(tmp_path)
    credited: list[tuple[int, int, int, float]] = []
    real_update = policy.bandit.update

    def update(batch, arm, tokens, seconds):
        credited.append((batch, arm.draft_steps, tokens, round(seconds, 6)))
        real_update(batch, arm, tokens, seconds)

    policy.bandit.update = update
    policy.on_verify_complete([], batch_size=1)  # a report before any step only starts the clock
    assert policy.get_steps_for_batch(4) == 0
    clock[0] += 0.01
    policy.on_verify_complete([0, 0, 0, 0], batch_size=4)
    # The overlapped scheduler launches the next step before the previous one reports.
    assert policy.get_steps_for_batch(4) == 1  # arm 0 has its sample: the next untried arm
    assert policy.get_steps_for_batch(9) == 0  # another bucket, its own arms
    clock[0] += 0.02
    policy.on_verify_complete([1, 1, 0, 2], batch_size=4)
    clock[0] += 0.03
    policy.on_verify_complete([0] * 9, batch_size=9)
    assert credited == [(4, 0, 4, 0.01), (4, 1, 8, 0.02), (9, 0, 9, 0.03)]
    assert policy.get_steps_for_batch(4) == 2


def test_on_the_cpu_a_step_lasts_from_its_launch_to_the_next(tmp_path: Path, clock: list[float]) -> None:
    # SGLang's CPU engine computes a step inside its launch and does not overlap: it reports step
    # k, processes its results and prepares the next batch, then launches k+1. That work is part of
    # the step's cost, so the step is credited at the next launch, not at its report.
    policy = _policy(tmp_path, synchronous=True)
    credited = []
    policy.bandit.update = lambda batch, arm, tokens, seconds: credited.append((arm.draft_steps, tokens, round(seconds, 6)))
    assert policy.get_steps_for_batch(4) == 0
    clock[0] += 0.05  # the forward passes of step 1
    policy.on_verify_complete([0, 0, 0, 0], batch_size=4)
    assert credited == []  # result processing and the next batch's preparation are still to come
    clock[0] += 0.02
    policy.get_steps_for_batch(4)
    assert credited == [(0, 4, 0.07)]
    clock[0] += 0.03
    policy.on_verify_complete([], batch_size=4)  # an empty report only pops its step
    clock[0] += 0.01
    policy.get_steps_for_batch(4)
    assert credited == [(0, 4, 0.07)]
    # Were the report to come after the next launch (an overlapping loop), the launches bound it.
    clock[0] += 0.04
    policy.get_steps_for_batch(4)
    policy.on_verify_complete([1, 1, 1, 1], batch_size=4)
    assert credited[-1][2] == 0.04
    clock[0] += 0.30  # a slow step
    policy.on_verify_complete([0, 0, 0, 0], batch_size=4)
    clock[0] += adaptive_policy.MAX_STEP_SECONDS + 1  # then the server sits idle
    policy.get_steps_for_batch(4)
    assert len(credited) == 2  # the idle gap does not count as the slow step's duration


def test_a_drafter_catch_up_is_left_out_of_the_step_that_resumes_drafting(tmp_path: Path, clock: list[float]) -> None:
    policy = _policy(tmp_path, synchronous=True)
    credited = []
    policy.bandit.update = lambda batch, arm, tokens, seconds: credited.append((arm.draft_steps, round(seconds, 6)))
    policy.get_steps_for_batch(1)
    policy.exclude_from_step(0.5)  # the drafter catches up on what it missed, inside this step's draft
    clock[0] += 0.53
    policy.on_verify_complete([1], batch_size=1)
    policy.get_steps_for_batch(1)
    assert credited == [(0, 0.03)]
    overlapped = _policy(tmp_path, synchronous=False)  # there host time is not the step's cost
    overlapped.get_steps_for_batch(1)
    overlapped.exclude_from_step(0.5)
    assert overlapped._pending[-1].excluded == 0.0


def test_idle_gaps_are_not_credited_and_unmatched_steps_are_dropped(tmp_path: Path, clock: list[float]) -> None:
    policy = _policy(tmp_path)
    credited = []
    policy.bandit.update = lambda *args: credited.append(args)
    policy.get_steps_for_batch(2)
    policy.on_verify_complete([0, 0], batch_size=2)
    policy.get_steps_for_batch(2)
    clock[0] += adaptive_policy.MAX_STEP_SECONDS + 1  # the server sat idle
    policy.on_verify_complete([0, 0], batch_size=2)
    assert credited == []
    policy.get_steps_for_batch(8)  # a step whose report never comes (e.g. an aborted batch)
    policy.get_steps_for_batch(3)
    clock[0] += 0.02
    policy.on_verify_complete([1, 1, 1], batch_size=3)
    assert [(batch, arm.draft_steps) for batch, arm, *_ in credited] == [(3, 0)]
    assert not policy._pending


def test_metrics_follow_the_choices(tmp_path: Path, clock: list[float]) -> None:
    registry = CollectorRegistry()
    policy = _policy(tmp_path, steps=(0, 3), registry=registry)
    policy.on_verify_complete([], batch_size=1)
    assert policy.get_steps_for_batch(1) == 0
    assert registry.get_sample_value("tlt_sd_enabled") == 0
    clock[0] += 0.01
    policy.on_verify_complete([0], batch_size=1)
    assert policy.get_steps_for_batch(1) == 3
    assert registry.get_sample_value("tlt_sd_enabled") == 1
    assert registry.get_sample_value("tlt_sd_draft_steps") == 3
    clock[0] += 0.01
    policy.on_verify_complete([2], batch_size=1)
    assert registry.get_sample_value("tlt_sd_accept_length_count", {"source": "eagle"}) == 1
    assert registry.get_sample_value("tlt_sd_accept_length_sum", {"source": "eagle"}) == 3
    assert registry.get_sample_value("tlt_sd_choices_total", {"bucket": "0", "draft_steps": "3", "source": "eagle"}) == 1
