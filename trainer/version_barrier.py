"""A step's rollouts all come from one policy version: a rollout server is admitted to the pool only
once it serves the trainer's current version. Publishing loads the version into every known server;
a server that appears later (scaled up, restarted) loads it before its first request. A server that
cannot load it is not admitted (and asked again at its next pick)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import requests

from trainer.policy_publisher import PolicyPublisher, PublishFailed, served_version

logger = logging.getLogger(__name__)


class VersionBarrier:
    def __init__(self, publisher: PolicyPublisher) -> None:
        self.publisher = publisher
        self.version: int | None = None
        self._location = ""
        self._admitted: dict[str, int] = {}
        self._lock = threading.Lock()

    def publish(self, servers: Sequence[str], location: str, version: int) -> list[str]:
        """Make `version` (what the publisher's `write` returned) current and load it into
        `servers`; returns the servers that failed to (they are not admitted until they do)."""
        with self._lock:
            self.version, self._location = version, location
            self._admitted.clear()
            try:  # all at once (one broadcast reaches every server); one by one where that fails
                self.publisher.load_into(servers, location, version)
                self._admitted.update(dict.fromkeys(servers, version))
                return []
            except (PublishFailed, requests.RequestException) as err:
                logger.warning("policy v%d: %s; admitting the servers one by one", version, err)
        return [url for url in servers if not self.admit(url)]

    def admit(self, url: str) -> bool:
        """Whether `url` serves the current version, loading it there first if needed."""
        with self._lock:  # one load per server and version, however many threads pick it
            if self.version is None or self._admitted.get(url) == self.version:
                return True
            try:
                if served_version(url) != str(self.version):
                    self.publisher.load_into([url], self._location, self.version)
            except (PublishFailed, requests.RequestException) as err:
                logger.warning("rollout server %s not admitted: cannot serve policy v%d (%s)", url, self.version, err)
                return False
            self._admitted[url] = self.version
            return True

