"""The trainer's policy-update window, `tlt:{job}:trainer:updating` (set while the trainer updates
and publishes the policy, expiring in case it dies there). On a cluster the rollout pods are idle
during it and spot workers may train; where the workers share the trainer's CPU (`tlt run` on one
machine) they stay out of it, since every core they take is the trainer's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

TTL_S = 600


class UpdateWindow:
    """Mark (trainer) and read (spot workers) one job's update window."""

    def __init__(self, client: redis.Redis, job: str) -> None:
        self.client, self.key = client, f"tlt:{job}:trainer:updating"

    @contextmanager
    def marked(self) -> Iterator[None]:
        """The window is open for the duration of the block."""
        self.client.set(self.key, "1", ex=TTL_S)
        try:
            yield
        finally:
            self.client.delete(self.key)

    def is_open(self) -> bool:
        return bool(self.client.exists(self.key))
