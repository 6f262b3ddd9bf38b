"""`python -m drafter_service --port N`: the drafter gRPC service over the job store in Redis."""

from __future__ import annotations

import logging
import signal

import torch

from drafter_service.grpc_server import build_server
from drafter_service.store import DrafterStore
from tlt.settings.common import service_start
from tlt.settings.drafter_service import DrafterServiceSettings


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C."""
    settings, client = service_start(DrafterServiceSettings, "drafter_service", argv)
    torch.set_num_threads(settings.threads)
    store = DrafterStore(client, keep_versions=settings.keep_versions, lease_ttl_s=settings.lease_ttl_s)
    server = build_server(settings, store)
    server.start()
    logging.getLogger("drafter_service").info("serving on %s:%d", settings.host, settings.port)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=5))
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
