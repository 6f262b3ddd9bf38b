"""The committed gRPC stubs (tlt/v1/) are what `make proto` makes from proto/ now: CI fails on stale ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_are_up_to_date(tmp_path: Path) -> None:
    protos = sorted((ROOT / "proto").rglob("*.proto"))
    assert protos
    command = [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto"), f"--python_out={tmp_path}"]
    command += [f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", *map(str, protos)]
    subprocess.run(command, check=True, capture_output=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert generated, "protoc wrote nothing"
    stale = [str(p) for p in generated if (ROOT / p).read_bytes() != (tmp_path / p).read_bytes()]
    assert stale == [], f"stale stubs (run `make proto`): {stale}"
