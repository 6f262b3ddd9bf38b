"""A Kubernetes API for tests: kmock's stateful emulator (objects created, patched, deleted, listed
and watched over real HTTP), served from an event loop on a thread so that the synchronous
`kubernetes` client can talk to it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import kmock
from kubernetes import client


@contextmanager
def kubernetes_emulator() -> Iterator[client.ApiClient]:
    """An ApiClient pointed at a running emulator (stopped on exit)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    url: list[str] = []
    stop: list[asyncio.Event] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            emulator.resources.load_bundled()  # the built-in resource kinds (endpointslices among them)
            url.append(str(server.url).rstrip("/"))
            ready.set()
            await stop[0].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the Kubernetes emulator did not start")
    configuration = client.Configuration(host=url[0])
    try:
        with client.ApiClient(configuration) as api_client:
            yield api_client
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)


def endpoint_slice(name: str, service: str, endpoints: list[tuple[str, bool]], port: int) -> client.V1EndpointSlice:
    """A slice of `service` with (address, ready) endpoints on `port` (named http)."""
    return client.V1EndpointSlice(
        metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/service-name": service}),
        address_type="IPv4",
        endpoints=[
            client.V1Endpoint(addresses=[address], conditions=client.V1EndpointConditions(ready=ready)) for address, ready in endpoints
        ],
        ports=[client.DiscoveryV1EndpointPort(name="http", port=port, protocol="TCP")],
    )
