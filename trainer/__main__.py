"""`python -m trainer --port N`: the job API over the job store in Redis, and the runner that trains
the jobs over the rollout servers. Under `torchrun --nproc-per-node N -m trainer ...` the policy is
sharded over N ranks (FSDP2): rank 0 is the service, the other ranks follow it (`trainer.follower`)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Sequence

import torch
from transformers.utils import logging as hf_logging

from tlt.rpc.service import build_grpc_server
from tlt.settings.common import service_start
from tlt.settings.trainer import TrainerSettings
from trainer.distributed import Command, TrainerGroup
from trainer.follower import follow
from trainer.grpc_server import build_server
from trainer.job_store import JobStore
from trainer.runner import JobRunner
from trainer.training_state import ShardingOptions


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
    group = TrainerGroup.from_environment(settings.resolved_device())
    if group is not None and not group.is_main:
        # The first process of every other trainer pod answers its pod's health probes.
        health = None
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            health = build_grpc_server("tlt.trainer.Follower", lambda _: None, settings)
            health.start()
        follow(group, ShardingOptions(settings.mixed_precision, settings.activation_checkpointing))
        if health is not None:
            health.stop(grace=1)
        return
    store = JobStore(client, max_jobs=settings.max_jobs)
    discover = discovery(settings)
    runner = JobRunner(store, settings, discover, group)
    server = build_server(settings, store, runner)
    server.start()
    runner.start()
    logging.getLogger("trainer").info("serving the job API on %s:%d; rollout servers now: %s", settings.host, settings.port, discover())

    def shutdown(*_) -> None:
        runner.stop()
        server.stop(grace=2)
        if group is not None:
            try:
                group.command(Command.STOP)
            except RuntimeError:  # the other ranks were signalled too (torchrun, a pod's deletion) and left
                pass

    signal.signal(signal.SIGTERM, shutdown)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        shutdown()


if __name__ == "__main__":
    main()
