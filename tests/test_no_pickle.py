"""Nothing that crosses a process boundary is unpickled: a scan of the project's own code."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["tlt", "rollout_server", "drafter_service", "trainer", "benchmarks"]
BANNED_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def _violations(source: str, path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{path}: import {a.name}" for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES:
            found.append(f"{path}: from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load":
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "torch":
                safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
                if not safe:
                    found.append(f"{path}:{node.lineno}: torch.load without weights_only=True")
    return found


def test_the_scan_catches_what_it_looks_for() -> None:
    bad = "import pickle\nfrom dill import loads\nimport torch\ntorch.load('x')\n"
    assert len(_violations(bad, Path("bad.py"))) == 3
    assert _violations("import torch\ntorch.load('x', weights_only=True)\n", Path("ok.py")) == []


def test_no_pickle_in_the_project() -> None:
    files = [f for package in PACKAGES for f in (ROOT / package).rglob("*.py")]
    assert len(files) > 20
    violations = [v for f in files for v in _violations(f.read_text(), f.relative_to(ROOT))]
    assert violations == []
