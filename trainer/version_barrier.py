"""A step's rollouts all come from one policy version: a rollout server is admitted to the pool only
once it serves the trainer's current version. Publishing loads the version into every known server;
a server that appears later (scaled up, restarted) loads it before its first request. A server that
cannot load it is not admitted (and asked again at its next pick)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import requests

from trainer.policy_publisher import DiskPolicyPublisher, PublishFailed

logger = logging.getLogger(__name__)


class VersionBarrier:
    def __init__(self, publisher: DiskPolicyPublisher) -> None:
        self.publisher = publisher
        self.version: int | None = None
        self._path: Path | None = None
        self._admitted: dict[str, int] = {}
        self._lock = threading.Lock()

    def publish(self, servers: Sequence[str], path: Path, version: int) -> list[str]:
        """Make `version` (checkpoint at `path`) current and load it into `servers`; returns the
        servers that failed to load it (they are not admitted until they do)."""
        with self._lock:
            self.version, self._path = version, path
            self._admitted.clear()
        failed = []
        for url in servers:
            if not self.admit(url):
                failed.append(url)
        return failed

    def admit(self, url: str) -> bool:
        """Whether `url` serves the current version, loading it there first if needed."""
        with self._lock:  # one load per server and version, however many threads pick it
            if self.version is None or self._admitted.get(url) == self.version:
                return True
            try:
                if served_version(url) != str(self.version):
                    self.publisher.load_into([url], self._path, self.version)
            except (PublishFailed, requests.RequestException) as err:
                logger.warning("rollout server %s not admitted: cannot serve policy v%d (%s)", url, self.version, err)
                return False
            self._admitted[url] = self.version
            return True


def served_version(url: str) -> str | None:
    """The policy version the server says it serves (SGLang's weight_version)."""
    answer = requests.get(f"{url}/model_info", timeout=5)
    answer.raise_for_status()
    return answer.json().get("weight_version")
