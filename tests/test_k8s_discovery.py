"""Discovery of the rollout servers from the rollout Service's EndpointSlices, through the real
`kubernetes` client against kmock's emulated API server: slices created, changed and deleted are
seen by the watch; other services' slices and unready endpoints are not servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from tests.kube_emulator import endpoint_slice, kubernetes_emulator
from tests.rollout_batches import greedy_batch
from tlt.paths import BUNDLED_MODEL
from tlt.rollout.k8s_discovery import EndpointSliceDiscovery


def _eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the watch did not catch up"
        time.sleep(0.05)


def test_the_watch_follows_the_rollout_services_slices() -> None:
    with kubernetes_emulator() as api_client:
        api = client.DiscoveryV1Api(api_client)
        api.create_namespaced_endpoint_slice("tlt", endpoint_slice("rollout-a", "tlt-rollout", [("10.0.0.1", True)], 30000))
        api.create_namespaced_endpoint_slice("tlt", endpoint_slice("other", "tlt-drafter", [("10.0.9.9", True)], 50061))
        discovery = EndpointSliceDiscovery("tlt-rollout", "tlt", api_client=api_client).start()
        try:
            assert discovery() == ["http://10.0.0.1:30000"]  # from the first listing

            scaled_up = endpoint_slice("rollout-b", "tlt-rollout", [("10.0.0.2", True), ("10.0.0.3", False)], 30001)
            api.create_namespaced_endpoint_slice("tlt", scaled_up)
            _eventually(lambda: discovery() == ["http://10.0.0.1:30000", "http://10.0.0.2:30001"])  # 10.0.0.3 not ready

            ready_now = endpoint_slice("rollout-b", "tlt-rollout", [("10.0.0.2", True), ("10.0.0.3", True)], 30001)
            api.patch_namespaced_endpoint_slice("rollout-b", "tlt", ready_now)  # a pod became ready
            _eventually(lambda: "http://10.0.0.3:30001" in discovery())

            api.delete_namespaced_endpoint_slice("rollout-a", "tlt")  # scaled down
            _eventually(lambda: discovery() == ["http://10.0.0.2:30001", "http://10.0.0.3:30001"])
        finally:
            discovery.stop()


def test_terminating_endpoints_and_unknown_readiness() -> None:
    from tlt.rollout.k8s_discovery import slice_urls

    endpoints = [
        client.V1Endpoint(addresses=["10.0.0.1"], conditions=client.V1EndpointConditions(ready=True, terminating=True)),
        client.V1Endpoint(addresses=["10.0.0.2"], conditions=None),  # unknown: ready, as Kubernetes documents
        client.V1Endpoint(addresses=["fd00::5"], conditions=client.V1EndpointConditions(ready=True)),
    ]
    piece = client.V1EndpointSlice(address_type="IPv4", endpoints=endpoints, ports=[client.DiscoveryV1EndpointPort(name="metrics", port=9)])
    assert slice_urls(piece, "http", 30000) == ["http://10.0.0.2:30000", "http://[fd00::5]:30000"]


@pytest.mark.slow
def test_scaling_the_rollout_pods_mid_step_loses_and_repeats_no_sample(tmp_path: Path) -> None:
    """`kubectl scale` as the EndpointSlices show it, with real rollout servers behind the
    endpoints: a pod added mid-step gets work; a pod removed mid-step (endpoint gone, then the
    process killed with requests in flight) has its requests re-sent; every sample comes back once,
    equal to a healthy server's greedy output."""
    from tlt.local.process import RolloutServerProcess
    from tlt.rollout.pool import RolloutPool

    batch = greedy_batch(48)
    a = RolloutServerProcess(BUNDLED_MODEL, tmp_path / "a.log")
    b = RolloutServerProcess(BUNDLED_MODEL, tmp_path / "b.log")
    with a.start(), b.start(), kubernetes_emulator() as api_client:
        reference, _ = RolloutPool(lambda: [b.url], max_concurrency=16).run(batch)
        api = client.DiscoveryV1Api(api_client)
        api.create_namespaced_endpoint_slice("tlt", endpoint_slice("rollout-a", "tlt-rollout", [("127.0.0.1", True)], a.port))
        discovery = EndpointSliceDiscovery("tlt-rollout", "tlt", api_client=api_client).start()
        done: list[str] = []
        lock = threading.Lock()

        def on_done(request, completion) -> None:
            with lock:
                done.append(request.key)
                count = len(done)
            if count == 8:  # scaled up: a new pod became ready
                api.create_namespaced_endpoint_slice("tlt", endpoint_slice("rollout-b", "tlt-rollout", [("127.0.0.1", True)], b.port))
            if count == 20:  # scaled down: the endpoint goes, then the pod is killed
                api.delete_namespaced_endpoint_slice("rollout-a", "tlt")
                _eventually(lambda: discovery() == [b.url])
                a.kill()

        try:
            results, stats = RolloutPool(discovery, max_concurrency=16).run(batch, on_done)
        finally:
            discovery.stop()
    print(f"completions by server: {stats.by_server}; re-sent {stats.resent}")
    assert sorted(done) == sorted(r.key for r in batch) and len(done) == len(set(done))
    assert {k: c.output_ids for k, c in results.items()} == {k: c.output_ids for k, c in reference.items()}
    assert stats.by_server.get(b.url, 0) > 0 and stats.by_server.get(a.url, 0) > 0
