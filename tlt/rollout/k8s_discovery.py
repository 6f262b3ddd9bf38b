"""Rollout servers on Kubernetes: the ready endpoints of the rollout Service's EndpointSlices
(discovery.k8s.io/v1), kept current by a list + watch on a thread, so `kubectl scale` takes effect
within a step. Needs RBAC to list and watch endpointslices in the namespace (the chart's Role)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

logger = logging.getLogger(__name__)
SERVICE_LABEL = "kubernetes.io/service-name"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_api_client() -> client.ApiClient:
    """In a pod: the service account's credentials; elsewhere: the kubeconfig's current context."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def current_namespace() -> str:
    return NAMESPACE_FILE.read_text().strip() if NAMESPACE_FILE.exists() else "default"


def slice_urls(endpoint_slice: client.V1EndpointSlice, port_name: str, default_port: int, scheme: str = "http") -> list[str]:
    """The base URLs of a slice's ready endpoints (readiness unknown counts as ready, as Kubernetes
    documents); the port named `port_name` in the slice, else `default_port`."""
    port = next((p.port for p in endpoint_slice.ports or () if p.name == port_name and p.port), default_port)
    urls = []
    for endpoint in endpoint_slice.endpoints or ():
        conditions = endpoint.conditions
        if conditions is not None and (conditions.ready is False or conditions.terminating):
            continue
        for address in endpoint.addresses or ():
            host = f"[{address}]" if ":" in address else address
            urls.append(f"{scheme}://{host}:{port}")
    return urls


class EndpointSliceDiscovery:
    """Callable like a static server list: the current rollout server URLs, sorted."""

    def __init__(
        self,
        service: str,
        namespace: str | None = None,
        port_name: str = "http",
        default_port: int = 30000,
        api_client: client.ApiClient | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        self.service, self.namespace = service, namespace or current_namespace()
        self.port_name, self.default_port, self.watch_timeout_s = port_name, default_port, watch_timeout_s
        self.api = client.DiscoveryV1Api(api_client or default_api_client())
        self._slices: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)

    def start(self, timeout_s: float = 30.0) -> EndpointSliceDiscovery:
        """Start watching; returns once the first listing arrived (or after `timeout_s`)."""
        self._thread.start()
        if not self._synced.wait(timeout_s):
            logger.warning("no EndpointSlice listing of service %s/%s yet", self.namespace, self.service)
        return self

    def stop(self) -> None:
        self._stop.set()

    def __call__(self) -> list[str]:
        with self._lock:
            return sorted({url for urls in self._slices.values() for url in urls})

    def _mine(self, endpoint_slice: client.V1EndpointSlice) -> bool:
        return (endpoint_slice.metadata.labels or {}).get(SERVICE_LABEL) == self.service

    def _run(self) -> None:
        selector = f"{SERVICE_LABEL}={self.service}"
        while not self._stop.is_set():
            try:
                listing = self.api.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                with self._lock:
                    self._slices = {
                        s.metadata.name: slice_urls(s, self.port_name, self.default_port) for s in listing.items if self._mine(s)
                    }
                self._synced.set()
                stream = watch.Watch().stream(
                    self.api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=selector,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=self.watch_timeout_s,
                )
                for event in stream:
                    endpoint_slice = event["object"]
                    if self._stop.is_set():
                        break
                    if not self._mine(endpoint_slice):
                        continue
                    with self._lock:
                        if event["type"] == "DELETED":
                            self._slices.pop(endpoint_slice.metadata.name, None)
                        else:
                            self._slices[endpoint_slice.metadata.name] = slice_urls(endpoint_slice, self.port_name, self.default_port)
            except (ApiException, HTTPError, OSError, ValueError) as err:  # API server restarting, 410 Gone, stream dropped
                logger.warning("EndpointSlice watch of %s/%s interrupted (%s); listing again", self.namespace, self.service, err)
                self._stop.wait(1.0)
