"""Kill -9 of every component during one running job, the whole system as processes (`LocalCluster`,
Redis persisting to disk): a rollout server mid-step, a spot worker mid-slice, the drafter service,
the trainer mid-step and Redis mid-step, each restarted a second later as Kubernetes would. The job
finishes with every step recorded exactly once and every step's samples complete (none lost, none
twice), every server serving the final policy version and a drafter version that verifies. The test
prints the time each fault cost: its window (from the step boundary before the kill to the one
before the next kill) less the window's completed steps at the median undisturbed step time."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from tests.metrics import metric_value
from tlt.jobs.client import JobClient
from tlt.jobs.records import JobEvent, JobState
from tlt.jobs.spec import JobSpec
from tlt.local.cluster import ClusterConfig, LocalCluster
from tlt.paths import BUNDLED_DRAFTER
from tlt.rollout.client import model_info
from tlt.store.spot_progress import SpotProgressBoard
from tlt.store.weight_channel import WeightChannel
from trainer.job_store import JobStore

pytestmark = pytest.mark.slow

STEPS = 36
RESTART_AFTER_S = 1.0  # what a kubelet's restart of a crashed container takes, roughly
SPEC = JobSpec(
    name="faults", steps=STEPS, prompts_per_step=16, samples_per_prompt=4, max_new_tokens=256,
    drafter_path=BUNDLED_DRAFTER, eval_every=0, seed=3,
)  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("faults")
    config = ClusterConfig(
        servers=2,
        redis_data_dir=root / "redis",
        # Slices must start in the short idle gaps of a job on 2 cores, to be killed in one.
        spot_worker_args=("--idle-grace-s", "0.2", "--min-new-samples", "8"),
    )
    with LocalCluster(SPEC, root / "runs", root, config) as running:
        yield running


def _until(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.05) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if result := condition():
                return result
        except (grpc.RpcError, OSError):  # a service or Redis restarting
            pass
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_job_survives_a_kill_of_each_component(cluster: LocalCluster) -> None:
    assert cluster.redis is not None and cluster.trainer is not None and cluster.drafter_service is not None
    redis_server, trainer, drafter_service = cluster.redis, cluster.trainer, cluster.drafter_service
    client = JobClient(trainer.target, cluster.auth_token, timeout_s=5)
    store = JobStore(redis_server.settings.client())

    def steps_done() -> int:
        return client.get(SPEC.name).steps_done

    def mid_step() -> None:
        """Wait for the next step to start, then half a second more: samples are being generated."""
        now = _until(lambda: steps_done() + 1, 300, "the trainer") - 1
        _until(lambda: steps_done() > now, 300, f"step {now}")
        time.sleep(0.5)

    def kill_then_restart(process) -> threading.Thread:
        """Kill -9 now; a second later a restart begins in the background, as a kubelet's would."""
        process.kill()
        restarter = threading.Thread(target=lambda: (time.sleep(RESTART_AFTER_S), process.start(timeout_s=300)))
        restarter.start()
        return restarter

    def kill_rollout_server() -> threading.Thread:
        mid_step()
        return kill_then_restart(cluster.rollout_servers[1])

    def kill_spot_worker_mid_slice() -> threading.Thread:
        board = SpotProgressBoard(store.client, SPEC.name)
        training = _until(lambda: [p for p in board.read() if p.state == "training"], 300, "a spot-training slice", poll_s=0.01)
        return kill_then_restart(cluster.spot_workers[int(training[0].worker_id.removeprefix("rollout-"))])

    def kill_drafter_service() -> threading.Thread:
        mid_step()
        return kill_then_restart(drafter_service)

    def kill_trainer() -> threading.Thread:
        mid_step()
        return kill_then_restart(trainer)

    def kill_redis() -> threading.Thread:
        mid_step()
        return kill_then_restart(redis_server)

    faults = {
        "rollout server": kill_rollout_server,
        "spot worker (mid-slice)": kill_spot_worker_mid_slice,
        "drafter service": kill_drafter_service,
        "trainer": kill_trainer,
        "Redis": kill_redis,
    }
    client.submit(SPEC)
    killed_at: dict[str, float] = {}
    for name, fault in faults.items():
        restarting = fault()
        killed_at[name] = time.time()
        restarting.join()  # the next fault only once this one's process is back
        during = _until(steps_done, 300, "the trainer", 0.2) if name != "trainer" else None
        print(f"killed the {name}; it is back, the job at step {during}")
        assert during is None or during < STEPS - 1, "the job ended before the faults did: make it longer"
    record = _until(lambda: (r := client.get(SPEC.name)).state != "RUNNING" and r, 900, "the job's end", 0.5)
    assert record.state == JobState.SUCCEEDED.value, record.message

    events = store.events(SPEC.name, block_ms=None)
    steps = [e.step for e in events if e.step is not None]
    # Every step recorded once, in order, each with all its samples from the step's policy version.
    assert [s.step for s in steps] == list(range(STEPS))
    per_step = SPEC.prompts_per_step * SPEC.samples_per_prompt
    assert all(s.samples == per_step == sum(s.samples_by_server.values()) for s in steps)
    assert all(s.stale_samples == 0 and s.policy_version == s.step for s in steps)
    # No version half-applied: the servers serve the final policy, the newest drafter verifies.
    assert {model_info(server.url)["weight_version"] for server in cluster.rollout_servers} == {str(STEPS)}
    drafters = WeightChannel(store.client, SPEC.name, "drafter")
    manifest, _ = drafters.load()
    for server in cluster.rollout_servers:
        assert metric_value(server.url, "tlt_drafter_version") in {0, *drafters.versions()}
    resumed = [e.message for e in events if e.state == JobState.RUNNING and e.message.startswith("resuming")]
    assert any("resuming" in m for m in resumed), "the killed trainer's job never resumed"
    print(f"resumptions: {resumed}; newest drafter v{manifest.version}; re-sent samples by step {[s.resent for s in steps]}")
    _report_time_lost(events, killed_at)


def _report_time_lost(events: list[JobEvent], killed_at: dict[str, float]) -> None:
    """Print each fault's cost. The expected step time is the median step after the first (which
    warms up): fewer than half the steps are disturbed."""
    started = next(e.time for e in events if e.state == JobState.RUNNING)
    boundaries = [started] + [e.time for e in events if e.step is not None]
    expected = statistics.median(b - a for a, b in itertools.pairwise(boundaries[1:]))
    lines = [f"median step {expected:.1f} s"]
    names = sorted(killed_at, key=killed_at.__getitem__)
    for n, name in enumerate(names):
        until = killed_at[names[n + 1]] if n + 1 < len(names) else boundaries[-1]
        start = max(b for b in boundaries if b <= killed_at[name])
        end = max(b for b in boundaries if b <= until)
        completed = sum(1 for b in boundaries if start < b <= end)
        lost = (end - start) - completed * expected
        lines.append(f"{name}: {lost:.1f} s lost ({completed} steps in {end - start:.1f} s)")
    print("time lost per fault:\n  " + "\n  ".join(lines))
