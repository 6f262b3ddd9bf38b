"""The whole system on one machine, every part its own process on loopback (single-machine mode of
`tlt run` and the RL-step benchmark): an embedded Redis (or an external one), the drafter service,
rollout servers with the TLT plugin, a spot worker beside each, and the trainer.

The trainer's job API and the drafter service require a bearer token that the cluster makes up
(as it does the embedded Redis' password); `tlt run`'s own client and the spot workers get it, and
`run_dir/connection.json` (mode 0600) holds it for `tlt watch/cancel/list` while the cluster runs.
Every process started is listed in `run_dir/processes.jsonl` (kind, pid = process group, port)."""

from __future__ import annotations

import json
import logging
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from tlt.jobs.spec import JobSpec
from tlt.local.process import (
    GrpcServiceProcess,
    RolloutServerProcess,
    ServiceProcess,
    SidecarProcess,
    SpotWorkerProcess,
    stop_all,
)
from tlt.local.redis_server import EmbeddedRedis
from tlt.settings.common import PolicyChannel, Speculation
from tlt.store.connection import RedisSettings

logger = logging.getLogger(__name__)

# The history-draft arms `tlt run` adds beside EAGLE's with adaptive SD (the chart's
# rollout.historyArms too): 1.10x per RL step over EAGLE arms alone on the bundled job
# (benchmarks/rl_step.py, faster in both repetitions).
DEFAULT_HISTORY_ARMS: tuple[int, ...] = (2, 4, 8)


@dataclass
class ClusterConfig:
    servers: int = 2
    speculative: Speculation = "adaptive"
    history_arms: tuple[int, ...] = ()  # adaptive only: history-draft arms beside EAGLE's (their draft lengths)
    spot_training: bool = True  # spot workers train the job's drafter on idle servers
    redis_url: str | None = None  # external Redis; none: an embedded one
    redis_password: str | None = None
    redis_data_dir: Path | None = None  # the embedded Redis persists here (append-only file); none: memory only
    trainer_threads: int = 1
    trainer_ranks: int = 1  # > 1: the policy is sharded (FSDP2, gloo) over this many trainer processes
    policy_channel: PolicyChannel = "disk"  # redis: a policy follower beside each server
    spot_worker_args: tuple[str, ...] = ()  # extra flags of every spot worker (e.g. --idle-grace-s 0.2)
    auth_token: str | None = None  # of the trainer and the drafter service; none: one is made up


CONNECTION_FILE = "connection.json"


def read_connection(run_dir: Path) -> tuple[str, str] | None:
    """(trainer target, token) of the local cluster running for `run_dir`, if one is."""
    path = run_dir / CONNECTION_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record["trainer"], record["token"]


# Spot workers share the trainer's cores here: every thread of theirs, feature prefills included
# (a local copy of the policy, not the server's prefill at normal priority), runs at the lowest
# CPU priority. Measured on the bundled job: +3.7% per step, against +37% with server features.
# Their session keeps its normal priority (TLT_SPOT_SESSION_NICE, opt-in): niced as well, the
# workers of a fresh drafter got too little CPU to commit once in a 30-step job.
SHARED_CPU_SPOT_ENV = {"TLT_SPOT_NICE": "19", "TLT_SPOT_FEATURES": "local"}


def shared_cpu_spot_env(trainer_threads: int) -> dict[str, str]:
    """The spot workers' environment where they share the trainer's cores; inside its update
    only as many train as it leaves cores free: two on the one free core of 2 took a third of
    the trainer's (+19% per step, 13be644)."""
    free = max(0, len(os.sched_getaffinity(0)) - trainer_threads)
    return {**SHARED_CPU_SPOT_ENV, "TLT_SPOT_UPDATE_SLOTS": str(free)}


# A fresh drafter learns fast at this rate; the spot workers' default fine-tunes a trained one.
FRESH_DRAFTER_LR = 2e-3


class LocalCluster:
    """Starts the processes for `spec` (logs under `run_dir/logs`), stops them in reverse order.
    The trainer writes `runs_root/<job>/` (checkpoints, policy versions)."""

    def __init__(self, spec: JobSpec, runs_root: Path, run_dir: Path, config: ClusterConfig | None = None) -> None:
        self.spec, self.runs_root, self.run_dir, self.logs = spec, runs_root, run_dir, run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.config = config or ClusterConfig()
        self.auth_token = self.config.auth_token or secrets.token_urlsafe(32)
        self.redis: EmbeddedRedis | None = None
        self.rollout_servers: list[RolloutServerProcess] = []
        self.spot_workers: list[SpotWorkerProcess] = []
        self.processes: list[ServiceProcess] = []
        self.drafter_service: GrpcServiceProcess | None = None
        self.trainer: GrpcServiceProcess | None = None

    def _redis_env(self) -> dict[str, str]:
        if self.redis is not None:
            return self.redis.client_env()
        env = {"TLT_REDIS_URL": self.config.redis_url or ""}
        if self.config.redis_password:
            env["TLT_REDIS_PASSWORD"] = self.config.redis_password
        return env

    def start(self, on_phase=lambda phase: None) -> Self:
        """Start everything; `on_phase(text)` hears what is starting. Stops what started on failure."""
        try:
            self._start(on_phase)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, on_phase) -> None:
        job, config = self.spec.name, self.config
        if config.redis_url is None:
            on_phase("starting Redis")
            self.redis = EmbeddedRedis(data_dir=config.redis_data_dir, log_path=self.logs / "redis.log").start()
            self._record("redis", self.redis.process, self.redis.port)
        else:
            RedisSettings(url=config.redis_url, password=config.redis_password).client().ping()
        env = self._redis_env()
        on_phase(f"starting the drafter service and {config.servers} rollout server(s)")
        # Tokens travel in the environment, never on a command line (which any local user can read).
        drafter_env = {**env, "TLT_DRAFTER_AUTH_TOKEN": self.auth_token}
        self.drafter_service = GrpcServiceProcess("drafter_service", self.logs / "drafter_service.log", env=drafter_env)
        server_args = ["--random-seed", str(self.spec.seed), "--speculative", config.speculative, "--enable-metrics"]
        if config.speculative != "off":
            server_args += ["--draft-model-path", str(self._first_drafter()), "--drafter-job", job]
        if config.history_arms:
            server_args += ["--history-arms", json.dumps(list(config.history_arms))]
        if config.spot_training:
            server_args += ["--samples-job", job]
        self.rollout_servers = [
            RolloutServerProcess(self.spec.model_path, self.logs / f"rollout-{n}.log", args=server_args, env=env)
            for n in range(config.servers)
        ]
        starting = [self.drafter_service, *self.rollout_servers]
        self.processes += starting
        with ThreadPoolExecutor(len(starting)) as pool:  # SGLang starts slowly: start them side by side
            for future in [pool.submit(p.start) for p in starting]:
                future.result()
        for process in starting:
            self._record(process.kind, process.process, process.port)
        if config.spot_training:
            on_phase("starting the spot workers")
            for n, server in enumerate(self.rollout_servers):
                worker_args = [
                    "--server-url", server.url, "--drafter-service", self.drafter_service.target, "--job-id", job,
                    "--worker-id", f"rollout-{n}", "--policy-path", str(self.spec.model_path),
                    *(["--lr", str(FRESH_DRAFTER_LR)] if self.spec.drafter_path is None else []), *config.spot_worker_args,
                ]  # fmt: skip
                shared_cpu = {k: v for k, v in shared_cpu_spot_env(config.trainer_threads).items() if k not in os.environ}  # the user's own win
                spot_env = {**shared_cpu, **env, "TLT_SPOT_AUTH_TOKEN": self.auth_token}
                worker = SpotWorkerProcess(self.logs / f"spot-{n}.log", args=worker_args, env=spot_env).start(60)
                self.spot_workers.append(worker)
                self.processes.append(worker)
                self._record(worker.kind, worker.process, None)
        if config.policy_channel == "redis":
            on_phase("starting the policy followers")
            for n, server in enumerate(self.rollout_servers):
                follower_args = [
                    "--server-url", server.url, "--job-id", job, "--base-model-path", str(self.spec.model_path),
                    "--work-dir", str(self.logs.parent / "followers" / f"rollout-{n}"),
                ]  # fmt: skip
                follower = SidecarProcess("rollout_server.policy_follower", self.logs / f"follower-{n}.log", follower_args, env)
                self.processes.append(follower.start(60))
                self._record(follower.kind, follower.process, None)
        on_phase("starting the trainer")
        trainer_args = ["--runs-dir", str(self.runs_root), "--threads", str(config.trainer_threads)]
        trainer_args += ["--drafter-service", self.drafter_service.target, "--policy-channel", config.policy_channel]
        for server in self.rollout_servers:
            trainer_args += ["--rollout-servers", server.url]
        trainer_env = {**env, "TLT_TRAINER_AUTH_TOKEN": self.auth_token, "TLT_TRAINER_DRAFTER_AUTH_TOKEN": self.auth_token}
        self.trainer = GrpcServiceProcess(
            "trainer", self.logs / "trainer.log", args=trainer_args, env=trainer_env, ranks=config.trainer_ranks
        )
        self.processes.append(self.trainer.start(120))
        self._record(self.trainer.kind, self.trainer.process, self.trainer.port)
        self._write_connection()

    def _first_drafter(self) -> Path:
        """The servers' first drafter: the job's, or (no drafter_path) a fresh one, the same the
        drafter service registers as version 1."""
        if self.spec.drafter_path is not None:
            return self.spec.drafter_path
        from tlt.drafter.model import export_fresh_drafter  # torch: only for a job that needs it

        fresh = self.run_dir / "fresh-drafter"
        export_fresh_drafter(self.spec.model_path, fresh)
        return fresh

    def _record(self, kind: str, process, port: int | None) -> None:
        with (self.run_dir / "processes.jsonl").open("a") as out:
            out.write(json.dumps({"kind": kind, "pid": process.pid, "port": port}) + "\n")

    def _write_connection(self) -> None:
        assert self.trainer is not None
        path = self.run_dir / CONNECTION_FILE
        path.unlink(missing_ok=True)
        # Created 0600, never wider: the token is the only thing between other local users and the job API.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"trainer": self.trainer.target, "token": self.auth_token}, out)

    def stop(self) -> None:
        """Stop the trainer, then every other process side by side, then Redis."""
        (self.run_dir / CONNECTION_FILE).unlink(missing_ok=True)
        if self.trainer is not None:
            self.trainer.stop()  # first: it must not see the servers go while it still works
        stop_all(self.processes)
        self.processes.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
