"""Shared fixtures: random checkpoints, and rollout servers as real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.checkpoints import make_random_checkpoint
from tlt.local.process import RolloutServerProcess
from tlt.local.redis_server import EmbeddedRedis
from tlt.paths import BUNDLED_MODEL


@pytest.fixture(scope="session")
def random_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: make_random_checkpoint(arch, root / arch) for arch in ("qwen2", "llama")}


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    if not (BUNDLED_MODEL / "config.json").exists():
        pytest.fail(f"bundled model missing at {BUNDLED_MODEL}: run `tlt make-tiny-model`")
    return BUNDLED_MODEL


@pytest.fixture(scope="module", params=["qwen2", "llama", "tiny-gcd"])
def served_model(
    request: pytest.FixtureRequest, random_checkpoints: dict[str, Path], tiny_model: Path, tmp_path_factory
) -> Iterator[tuple[str, Path, RolloutServerProcess]]:
    """(name, checkpoint, running server) for each model; one server at a time."""
    name = request.param
    path = tiny_model if name == "tiny-gcd" else random_checkpoints[name]
    log = tmp_path_factory.mktemp(f"server-{name}") / "server.log"
    server = RolloutServerProcess(path, log, args=["--random-seed", "0"])
    with server:
        yield name, path, server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A real redis-server (password-protected), shared by the session's tests; jobs keep them apart."""
    with EmbeddedRedis(log_path=tmp_path_factory.mktemp("redis") / "redis.log") as server:
        yield server
