"""The run report: figures computed from the events, plots written, one table row per step."""

from __future__ import annotations

from pathlib import Path

from tlt.jobs.records import JobEvent, JobState, StepMetrics
from tlt.local.report import write_report
from tlt.local.sd_timeline import TimelinePoint


def _step(step: int, reward: float, eval_accuracy: float = -1.0) -> StepMetrics:
    return StepMetrics(
        step=step, policy_version=step, reward_mean=reward, samples=16, groups_used=2, response_tokens=900,
        rollout_s=6.0, tail_s=2.0, train_s=3.0, publish_s=0.5, loss=0.1, clip_fraction=0.0,
        spec_accept_length=2.0 + step, speculated_fraction=0.5, resent=0, stale_samples=0,
        drafter_version=1 + step, eval_accuracy=eval_accuracy, step_s=10.0,
    )  # fmt: skip


def test_the_report_states_the_figures_and_draws_the_plots(tmp_path: Path) -> None:
    events = [
        JobEvent(job_id="j", time=1.0, state=JobState.RUNNING, message="held-out", eval_accuracy=0.25),
        JobEvent(job_id="j", time=2.0, step=_step(0, 0.5)),
        JobEvent(job_id="j", time=3.0, step=_step(1, 0.75, eval_accuracy=0.5)),
        JobEvent(job_id="j", time=4.0, state=JobState.SUCCEEDED),
    ]
    timeline = [TimelinePoint(time=t, server=s, running=8 - t, sd_on=t > 4, drafter_version=1 + t // 4) for t in range(8) for s in (0, 1)]
    report = write_report(tmp_path, "test job", events, timeline).read_text()
    assert "steps: 2, 20 s in all (10.0 s per step); rollout 60% of it" in report
    assert "of samples 33% of the rollout time" in report
    assert "0.500 (step 0) -> 0.750 (step 1)" in report
    assert "0.250 before training -> 0.500 after step 1" in report
    assert "| 1 | 0.750 | 0.500 | 6.0 | 2.0 | 3.0 | 0.50 | 10.0 | 50% | 3.00 | v2 | 0 |" in report
    for plot in ("step_time.png", "reward.png", "accept_length.png", "sd_timeline.png"):
        assert (tmp_path / plot).read_bytes().startswith(b"\x89PNG")


def test_a_job_without_steps_gets_a_short_report(tmp_path: Path) -> None:
    events = [JobEvent(job_id="j", time=1.0, state=JobState.CANCELLED, message="cancelled by a client")]
    assert "No step finished." in write_report(tmp_path, "cancelled", events, []).read_text()
    assert not list(tmp_path.glob("*.png"))
