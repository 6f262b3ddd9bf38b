"""The Dockerfile's layout (no Docker engine runs here): what UID 1000 needs to start the image's
python, and the GPU image pinning its device."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def _env() -> dict[str, str]:
    env: dict[str, str] = {}
    for kind, args in _instructions():
        if kind == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(args)))
    return env


def _arg_default(name: str) -> str:
    return next(args.split("=", 1)[1].strip('"') for kind, args in _instructions() if kind == "ARG" and args.startswith(f"{name}="))


def test_the_interpreter_and_the_venv_live_where_uid_1000_can_run_them() -> None:
    env = _env()
    # uv installs interpreters under the installing user's home unless told otherwise: /root is 0700.
    assert not env["UV_PYTHON_INSTALL_DIR"].startswith("/root") and env["VIRTUAL_ENV"].startswith("/opt/")
    runs = " ".join(args for kind, args in _instructions() if kind == "RUN")
    assert "uv python install" in runs and f"uv venv --python 3.11 {env['VIRTUAL_ENV']}" in runs
    assert f"chmod -R a+rX {env['UV_PYTHON_INSTALL_DIR']} {env['VIRTUAL_ENV']}" in runs
    order = [kind for kind, _ in _instructions()]
    user_at = order.index("USER")
    assert dict(_instructions())["USER"] == "1000"
    # The build itself starts the interpreter as that user.
    assert any(kind == "RUN" and "python -c" in args for kind, args in _instructions()[user_at:])


def test_the_gpu_image_pins_device_cuda_for_every_process() -> None:
    assert _arg_default("TARGET") == "cuda"
    env = _env()
    for variable in ("TLT_ROLLOUT_DEVICE", "TLT_TRAINER_DEVICE", "TLT_SPOT_DEVICE"):
        assert env[variable] == "${TARGET}", variable


def test_the_gpu_base_has_the_cuda_toolkit_flashinfer_compiles_with_and_matches_torchs_cuda() -> None:
    base = _arg_default("BASE")
    assert base.startswith("nvidia/cuda:13.0") and "-devel-" in base  # torch 2.14.1 on PyPI: CUDA 13.0


def test_every_file_the_image_copies_exists() -> None:
    for kind, args in _instructions():
        if kind == "COPY":
            for source in shlex.split(args)[:-1]:
                assert (ROOT / source).exists(), source
