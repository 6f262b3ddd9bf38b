"""`python -m rollout_server`: validate TLT's flags, prepare the device, start SGLang in-process."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import CliApp

from rollout_server import cpu
from rollout_server.adaptive_policy import adaptive_config_file
from rollout_server.drafter_swap import DRAFTER_JOB_ENV
from rollout_server.sample_recorder import SAMPLES_JOB_ENV
from rollout_server.sglang_args import bandit_config, sglang_argv
from tlt.settings.rollout_server import RolloutServerSettings


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
    with tempfile.TemporaryDirectory(prefix="tlt-rollout-") as scratch:
        adaptive_config = None
        if settings.speculative == "adaptive":
            adaptive_config = Path(scratch) / "adaptive.json"
            adaptive_config.write_text(json.dumps(adaptive_config_file(bandit_config(settings))))
        server_args = prepare_server_args(sglang_argv(settings, adaptive_config))
        try:
            run_server(server_args)
        finally:
            kill_process_tree(os.getpid(), include_parent=False)


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m rollout_server`."""
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except ValidationError as err:
        sys.exit(f"rollout_server: invalid settings:\n{err}")
    serve(settings)
