"""`python -m rollout_server`: validate TLT's flags, prepare the device, start SGLang in-process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import CliApp

from rollout_server import cpu
from rollout_server.adaptive_policy import adaptive_config_file
from rollout_server.cpu.fork_start import fork_sglang_children
from rollout_server.drafter_swap import DRAFTER_JOB_ENV
from rollout_server.sample_recorder import SAMPLES_JOB_ENV
from rollout_server.sglang_args import bandit_config, sglang_argv
from tlt.settings.rollout_server import RolloutServerSettings
from tlt.speculation.history import HistoryConfig

logger = logging.getLogger(__name__)


def parse_settings(argv: list[str]) -> RolloutServerSettings:
    """Settings from the command line (and TLT_ROLLOUT_* variables); args after `--` go to SGLang."""
    ours, sep, theirs = _split_at_double_dash(argv)
    settings = CliApp.run(RolloutServerSettings, cli_args=ours, cli_exit_on_error=True)
    if sep:
        settings = settings.model_copy(update={"sglang_args": [*settings.sglang_args, *theirs]})
    return settings


def _split_at_double_dash(argv: list[str]) -> tuple[list[str], bool, list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], True, argv[i + 1 :]
    return argv, False, []


class SpotWorkerChild:
    """`python -m rollout_server.spot_worker` beside the server, in its process tree (so on its
    GPU), restarted `restart_s` after it exits until `stop()`; its flags come from TLT_SPOT_*."""

    def __init__(self, restart_s: float = 5.0) -> None:
        self.restart_s = restart_s
        self._stop = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="tlt-spot-worker", daemon=True)

    def start(self) -> SpotWorkerChild:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self._process = subprocess.Popen([sys.executable, "-m", "rollout_server.spot_worker"], stdin=subprocess.DEVNULL)
            code = self._process.wait()
            if not self._stop.is_set():
                logger.warning("spot worker exited with %s; restarting it in %.0f s", code, self.restart_s)
                self._stop.wait(self.restart_s)

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()


def serve(settings: RolloutServerSettings) -> None:
    """Run SGLang's HTTP server with these settings until it exits."""
    if settings.resolved_device() == "cpu":
        cpu.activate_in_this_process()
        # Read by torch when SGLang's scheduler process starts.
        os.environ["OMP_NUM_THREADS"] = str(settings.cpu_threads)
    # Read by the plugin in SGLang's scheduler process, which inherits our environment.
    if settings.drafter_job is not None:
        os.environ[DRAFTER_JOB_ENV] = settings.drafter_job
    if settings.samples_job is not None:
        os.environ[SAMPLES_JOB_ENV] = settings.samples_job
    # SGLang reads its environment at import time: import it only now.
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    if settings.resolved_device() == "cpu":
        fork_sglang_children(settings.cpu_threads)
    with tempfile.TemporaryDirectory(prefix="tlt-rollout-") as scratch:
        adaptive_config = None
        if settings.speculative == "adaptive":
            adaptive_config = Path(scratch) / "adaptive.json"
            history = HistoryConfig() if settings.history_arms else None
            adaptive_config.write_text(json.dumps(adaptive_config_file(bandit_config(settings), history)))
        server_args = prepare_server_args(sglang_argv(settings, adaptive_config))
        # It waits for the server itself (the worker polls it until it answers).
        spot_worker = SpotWorkerChild().start() if settings.spot_worker else None
        try:
            run_server(server_args)
        finally:
            if spot_worker is not None:
                spot_worker.stop()
            kill_process_tree(os.getpid(), include_parent=False)


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m rollout_server`."""
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except ValidationError as err:
        sys.exit(f"rollout_server: invalid settings:\n{err}")
    serve(settings)
