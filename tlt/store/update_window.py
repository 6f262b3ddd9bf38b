"""The trainer's policy-update window, `tlt:{job}:trainer:updating` (set while the trainer updates
and publishes the policy, expiring in case it dies there). On a cluster the rollout pods are idle
during it and spot workers may train; where the workers share the trainer's CPU (`tlt run` on one
machine) only as many train in it as the trainer leaves cores free (`UpdateSlots`), since every
core more they take is the trainer's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError
from redis.lock import Lock

TTL_S = 600
SLOT_TTL_S = 10.0  # a slot whose holder stopped checking (killed, stuck in one unit) frees itself


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


class UpdateSlots:
    """At most `slots` workers of a job work inside its update window: a worker takes a free slot
    (a Redis lock) when it asks inside the window, keeps it while it keeps asking, and gives it
    back when its slice ends or the window closes. Outside the window every worker may work."""

    def __init__(self, client: redis.Redis, job: str, slots: int, ttl_s: float = SLOT_TTL_S) -> None:
        if slots < 0:
            raise ValueError(f"update slots must be >= 0, not {slots}")
        self.window = UpdateWindow(client, job)
        names = (f"tlt:{job}:trainer:update-slot:{n}" for n in range(slots))
        self._locks = [client.lock(name, timeout=ttl_s, blocking=False, thread_local=False) for name in names]
        self._held: Lock | None = None

    def allowed(self) -> bool:
        """Whether this worker may work now (inside the window: it holds a slot, taken if one is free)."""
        if not self.window.is_open():
            self.release()
            return True
        if self._held is not None:
            try:
                self._held.reacquire()  # the full TTL again
                return True
            except LockError:  # expired and maybe taken: try for a slot like anyone else
                self._held = None
        for lock in self._locks:
            if lock.acquire(blocking=False):
                self._held = lock
                return True
        return False

    def release(self) -> None:
        """Give the slot back, if one is held."""
        held, self._held = self._held, None
        if held is not None:
            try:
                held.release()
            except LockError:  # it had expired
                pass
