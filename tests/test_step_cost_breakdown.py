"""The step-cost benchmark's profile breakdown on stacks shaped like py-spy's collapsed output."""

from __future__ import annotations

import pytest

from benchmarks.spec_step_cost import breakdown

_ROOT = "run_scheduler_process (scheduler.py:6368);Scheduler.run_batch (scheduler.py:4744);EAGLEWorkerV2.forward_batch_generation (eagle_worker_v2.py:1480)"
STACKS = "\n".join(
    [
        f"{_ROOT};EagleDraftWorker.draft (eagle_worker_v2.py:711);EagleDraftWorker.draft_forward (eagle_worker_v2.py:800) 3",
        f"{_ROOT};EAGLEWorkerV2.verify (eagle_worker_v2.py:1980);extend_attention_cpu (rollout_server/cpu/attention.py:164) 2",
        f"{_ROOT};EAGLEWorkerV2.verify (eagle_worker_v2.py:1980);verify_tree_greedy_cpu (rollout_server/cpu/ops.py:300) 1",
        f"{_ROOT};EagleDraftWorker._draft_extend_for_decode (eagle_worker_v2.py:1211);rotate_input_ids_cpu (rollout_server/cpu/ops.py:150) 1",
        f"{_ROOT};EagleDraftWorker._draft_extend_for_decode (eagle_worker_v2.py:1211) 1",
        "run_scheduler_process (scheduler.py:6368);Scheduler.process_batch_result (scheduler.py:5000) 2",
        "Thread._bootstrap (threading.py:1002);Thread._bootstrap_inner (threading.py:1045);WatchdogRaw._watchdog_thread (watchdog.py:80) 7",
    ]
)


def test_samples_are_filed_under_the_innermost_op_or_their_stage_and_other_threads_left_out() -> None:
    shares = breakdown(STACKS)
    assert shares["samples"] == 10
    assert shares["draft forwards"] == pytest.approx(0.3)
    assert shares["target forward/verify"] == pytest.approx(0.2)
    assert shares["verify/sampling op"] == pytest.approx(0.1)
    assert shares["index/KV ops"] == pytest.approx(0.1)
    assert shares["draft extend"] == pytest.approx(0.1)
    assert shares["scheduler & other"] == pytest.approx(0.2)
    assert shares["of which TLT attention ops"] == pytest.approx(0.2)
