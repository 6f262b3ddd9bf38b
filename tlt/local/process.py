"""Start and stop TLT's servers as child processes (single-machine mode, tests, benchmarks)."""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from tlt.rollout.client import RolloutClient

logger = logging.getLogger(__name__)


# Linux hands out ports from its ephemeral range to bind(0) and to every outgoing connection, so a
# port found by bind(0) can be taken by some connection in the seconds before the child binds it
# (seen: a rollout server's HTTP port "already in use" at its start). Ports below that range are
# never handed out so; these also stay below SGLang's own later-bound ports (22000-29999).
_PORTS_BOUND_LATER = (10000, 21999)
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: its default
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on loopback for a child process to bind: free now, below the ephemeral range
    (so no outgoing connection gets it meanwhile) and not handed out before by this process."""
    low, high = _PORTS_BOUND_LATER[0], min(_PORTS_BOUND_LATER[1], _ephemeral_low() - 1)
    candidates = [p for p in random.sample(range(low, high + 1), min(64, max(0, high - low + 1))) if p not in _handed_out]
    port = next((p for p in candidates if _bindable(p)), None)
    if port is None:  # a small or taken range: the kernel's choice
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    _handed_out.add(port)
    return port


def guarded(argv: list[str]) -> list[str]:
    """`argv` under `tlt.local.guard`: it dies, with all it spawns, when its starter dies."""
    return [sys.executable, "-m", "tlt.local.guard", *argv]


def lower_session_priority(pid: int, nice: int) -> None:
    """Give the session that `pid` leads the CPU priority `nice` (Linux autogroup nice). With the
    kernel's autogroups on (most desktop and server kernels), each session competes as one group
    against other sessions and a thread's own nice counts only inside its session: a niced process
    in a session of its own would still take a core's worth from the trainer. No-op where there
    are no autogroups."""
    if nice <= 0:
        return
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except FileNotFoundError:  # not Linux, or a kernel without CONFIG_SCHED_AUTOGROUP
        pass
    except OSError as err:  # a read-only /proc (some containers): the worker runs, only less politely
        logger.warning("could not lower the CPU priority of session %d: %s", pid, err)


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time."""


class ServiceProcess:
    """`python -m <module>` in its own process group, logging to `log_path`; subclasses say how
    it is started and how it shows it is healthy."""

    kind = "service"
    session_nice = 0  # > 0: the CPU priority of the process's whole session (lower_session_priority)

    def __init__(
        self, log_path: Path, port: int | None = None, args: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> None:
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.args = list(args)
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The environment the process starts with: ours, with `env` over it."""
        return {**os.environ, **(self.env or {})}

    def start(self, timeout_s: float = 300.0) -> Self:
        """Launch and wait until healthy; raises ServerStartError with the log's tail."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                guarded(self.command()),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,  # servers spawn workers: stop them as one group
            )
        lower_session_priority(self.process.pid, self.session_nice)  # the session is new: only ours
        try:
            self._wait_until_healthy(timeout_s)
        except BaseException:  # Ctrl-C or a failed start: leave no server behind
            self.stop()
            raise
        return self

    def _wait_until_healthy(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"{self.kind} exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.5)
        raise ServerStartError(f"{self.kind} not healthy after {timeout_s:.0f}s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after `timeout_s`."""
        stop_all([self], timeout_s)

    def kill(self) -> None:
        """SIGKILL the process group at once, as a crash would (for fault tests)."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
            self.process = None

    def freeze(self) -> None:
        """SIGSTOP the process group: it keeps its sockets but answers nothing (a hang, for fault tests)."""
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Self:
        # `with process.start(timeout_s=...)` is fine too: a running process is not started twice.
        return self if self.alive() else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def stop_all(processes: Sequence[ServiceProcess], timeout_s: float = 20.0) -> None:
    """Stop these processes side by side: SIGTERM every group at once, then SIGKILL the groups
    that have not ended `timeout_s` later."""
    running = [p for p in processes if p.process is not None]
    for p in running:
        try:
            os.killpg(p.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    for p in running:
        try:
            p.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
        p.process = None


class RolloutServerProcess(ServiceProcess):
    """`python -m rollout_server` on a model; healthy when its /health answers."""

    kind = "rollout server"

    def __init__(
        self,
        model_path: Path,
        log_path: Path,
        port: int | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        # Stopping the process group ends SGLang's scheduler first, which its HTTP process takes for
        # a crash: it would sleep 5 s to collect py-spy and CUDA core dumps. A local stop is no crash.
        quiet_stop = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "false", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "false"}
        super().__init__(log_path, port, args, {**quiet_stop, **(env or {})})
        self.model_path = Path(model_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout_s: float = 600.0) -> RolloutClient:
        return RolloutClient(self.url, timeout_s=timeout_s)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "rollout_server", "--model-path", str(self.model_path), "--port", str(self.port), *self.args]

    def healthy(self) -> bool:
        return self.client().healthy()


class GrpcServiceProcess(ServiceProcess):
    """`python -m <module> --port N` serving gRPC; healthy when the gRPC health service says so."""

    def __init__(
        self,
        module: str,
        log_path: Path,
        port: int | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        tls_ca_file: Path | None = None,
        ranks: int = 1,
    ) -> None:
        """`ranks` > 1: torchrun starts that many processes of the module on this machine (rank 0
        serves; the trainer shards its policy over them)."""
        super().__init__(log_path, port, args, env)
        self.module = self.kind = module
        self.tls_ca_file = tls_ca_file  # the service speaks TLS: verify it with this CA
        self.ranks = ranks

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        launcher = [sys.executable]
        if self.ranks > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.ranks}"]
        return [*launcher, "-m", self.module, "--port", str(self.port), *self.args]

    def healthy(self) -> bool:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from tlt.rpc.service import client_channel

        with client_channel(self.target, self.tls_ca_file) as channel:
            try:
                answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            except grpc.RpcError:
                return False
        return answer.status == health_pb2.HealthCheckResponse.SERVING


class SidecarProcess(ServiceProcess):
    """`python -m <module>` beside a rollout server (spot worker, policy follower); it serves
    nothing, so running is healthy."""

    def __init__(self, module: str, log_path: Path, args: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        super().__init__(log_path, None, args, env)
        self.module = self.kind = module

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args]

    def healthy(self) -> bool:
        return self.alive()


class SpotWorkerProcess(SidecarProcess):
    """`python -m rollout_server.spot_worker`."""

    def __init__(self, log_path: Path, args: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        super().__init__("rollout_server.spot_worker", log_path, args, env)

    @property
    def session_nice(self) -> int:  # type: ignore[override]
        # Opt-in: a niced session also yields to the other sessions (trainer, servers) of a local
        # cluster, but on 2 cores it then gets so little CPU that a fresh drafter never learns
        # (README, "What it costs").
        return int(self.environment().get("TLT_SPOT_SESSION_NICE", "0"))
