"""One job on a local cluster from start to report (what `tlt run` and the RL-step benchmark do):
start the processes, submit over gRPC, follow the job's events into `runs/<job>/events.jsonl` and
`metrics.jsonl` while sampling the servers' SD timeline, stop everything, write the report.
Ctrl-C, SIGTERM (`timeout`, systemd, `docker stop`) and SIGHUP (a closed terminal) all cancel the
job (its rollouts are aborted) before the processes stop; a SIGKILL or a crash leaves nothing
running either, since every process dies with its starter (`tlt.local.guard`)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tlt.jobs.client import JobClient
from tlt.jobs.records import JobEvent, StepMetrics
from tlt.jobs.spec import JobSpec
from tlt.local.cluster import ClusterConfig, LocalCluster
from tlt.local.report import write_report
from tlt.local.sd_timeline import TimelineRecorder, read_timeline


@dataclass
class LocalRun:
    run_dir: Path
    events: list[JobEvent]
    state: str  # the job's last state; "" when it never got one
    message: str
    startup_s: float  # until every process was healthy
    job_s: float  # from submission to the job's end
    interrupted_by: str = ""  # the signal that stopped the run (SIGINT, SIGTERM, SIGHUP); "" when none did

    @property
    def interrupted(self) -> bool:
        return bool(self.interrupted_by)

    @property
    def steps(self) -> list[StepMetrics]:
        return [e.step for e in self.events if e.step is not None]


class Stopped(KeyboardInterrupt):
    """A stop signal arrived: handled as Ctrl-C (cancel the job, stop every process)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Stopped` in the main thread, as SIGINT raises KeyboardInterrupt.
    Only the first one does: later ones must not break off the cancellation and the clean-up that
    the first one started (each of which is bounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = threading.Event()

    def stop(signum: int, _frame) -> None:
        if not raised.is_set():
            raised.set()
            raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def append_event(run_dir: Path, event: JobEvent) -> None:
    """Record an event in events.jsonl (and a step's metrics in metrics.jsonl)."""
    with (run_dir / "events.jsonl").open("a") as out:
        out.write(event.model_dump_json() + "\n")
    if event.step is not None:
        with (run_dir / "metrics.jsonl").open("a") as out:
            out.write(event.step.model_dump_json() + "\n")


def read_events(run_dir: Path) -> list[JobEvent]:
    path = run_dir / "events.jsonl"
    return [JobEvent.model_validate_json(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def run_job_locally(
    spec: JobSpec,
    runs_root: Path,
    config: ClusterConfig,
    on_phase: Callable[[str], None] = lambda text: None,
    on_event: Callable[[JobEvent], None] = lambda event: None,
) -> LocalRun:
    """Run `spec` (its name is the job id and names `runs_root/<name>/`, which must not exist)."""
    run_dir = runs_root / spec.name
    run_dir.mkdir(parents=True)
    cluster = LocalCluster(spec, runs_root, run_dir, config)
    started = time.monotonic()
    startup_s = job_s = 0.0
    interrupted_by = ""
    with stop_signals_interrupt():
        try:
            cluster.start(on_phase)
            startup_s = time.monotonic() - started
            on_phase("running")
            urls = [s.url for s in cluster.rollout_servers]
            assert cluster.trainer is not None
            with (
                JobClient(cluster.trainer.target, cluster.auth_token) as client,
                TimelineRecorder(urls, run_dir / "sd_timeline.jsonl"),
            ):
                client.submit(spec)
                submitted = time.monotonic()
                last_seen = ""
                try:
                    for event in client.watch(spec.name):
                        append_event(run_dir, event)
                        last_seen = event.event_id
                        on_event(event)
                except KeyboardInterrupt as stop:
                    interrupted_by = stop.signal_name if isinstance(stop, Stopped) else "SIGINT"
                    on_phase(f"{interrupted_by}: cancelling the job")
                    client.cancel(spec.name)
                    for event in client.watch(spec.name, last_seen):  # until it says CANCELLED
                        append_event(run_dir, event)
                job_s = time.monotonic() - submitted
        except KeyboardInterrupt as stop:  # while starting: nothing was submitted
            interrupted_by = stop.signal_name if isinstance(stop, Stopped) else "SIGINT"
        finally:
            on_phase("stopping")
            cluster.stop()
    events = read_events(run_dir)
    title = f"{spec.name}: {spec.steps} GRPO steps, {config.servers} rollout server(s), SD {config.speculative}"
    write_report(run_dir, title, events, read_timeline(run_dir / "sd_timeline.jsonl"))
    final = next((e for e in reversed(events) if e.state), None)
    return LocalRun(
        run_dir, events, final.state if final else "", final.message if final else "", startup_s, job_s, interrupted_by
    )
