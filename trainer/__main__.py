"""`python -m trainer --port N`: the job API over the job store in Redis, and the runner that trains
the jobs over the rollout servers."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence

import torch
from transformers.utils import logging as hf_logging

from tlt.settings.common import service_start
from tlt.settings.trainer import TrainerSettings
from trainer.grpc_server import build_server
from trainer.job_store import JobStore
from trainer.runner import JobRunner


def discovery(settings: TrainerSettings) -> Callable[[], Sequence[str]]:
    """The rollout servers: the EndpointSlices of --rollout-service (watched), else the static list."""
    if settings.rollout_service:
        from tlt.rollout.k8s_discovery import EndpointSliceDiscovery

        namespace, _, name = settings.rollout_service.rpartition("/")
        return EndpointSliceDiscovery(name, namespace or None, settings.rollout_port_name, settings.rollout_port).start()
    servers = list(settings.rollout_servers)
    return lambda: servers


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C; a running job stays RUNNING and resumes at the next start."""
    settings, client = service_start(TrainerSettings, "trainer", argv)
    torch.set_num_threads(settings.threads)
    hf_logging.disable_progress_bar()  # a bar per saved checkpoint would flood the log
    store = JobStore(client, max_jobs=settings.max_jobs)
    discover = discovery(settings)
    runner = JobRunner(store, settings, discover)
    server = build_server(settings, store, runner)
    server.start()
    runner.start()
    logging.getLogger("trainer").info("serving the job API on %s:%d; rollout servers now: %s", settings.host, settings.port, discover())

    def shutdown(*_) -> None:
        runner.stop()
        server.stop(grace=2)

    signal.signal(signal.SIGTERM, shutdown)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        shutdown()


if __name__ == "__main__":
    main()
