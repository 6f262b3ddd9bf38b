"""`python -m drafter_service --port N`: the drafter gRPC service over the job store in Redis."""

from __future__ import annotations

import logging
import signal
import sys

import torch
from pydantic import ValidationError
from pydantic_settings import CliApp

from drafter_service.grpc_server import build_server
from drafter_service.store import DrafterStore
from tlt.settings import DrafterServiceSettings, RedisSettings


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = CliApp.run(DrafterServiceSettings, cli_args=sys.argv[1:] if argv is None else argv)
        redis_settings = RedisSettings()
    except ValidationError as err:
        sys.exit(f"drafter_service: invalid settings:\n{err}")
    torch.set_num_threads(settings.threads)
    client = redis_settings.client()
    client.ping()  # fail at start, not at the first call, when Redis is unreachable or refuses us
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
