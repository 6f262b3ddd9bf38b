"""Publishing a policy version to the rollout servers: the trainer writes an HF checkpoint to a
directory the servers can read (one machine; a shared volume on a cluster) and each server loads
it with SGLang's `/update_weights_from_disk`, tagged with the version, which SGLang then returns
with every generation (`meta_info.weight_version`): the trainer can check that a step's samples
all come from one version."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import requests
from transformers import PreTrainedModel, PreTrainedTokenizerBase


class PublishFailed(RuntimeError):
    """A server refused or failed to load a policy version."""


class DiskPolicyPublisher:
    """Writes `policy-v{N}` checkpoints under `root` (keeping the newest `keep`) and loads them into servers."""

    def __init__(self, root: Path, keep: int = 2, timeout_s: float = 600.0) -> None:
        self.root, self.keep, self.timeout_s = root, keep, timeout_s
        root.mkdir(parents=True, exist_ok=True)

    def write(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int) -> Path:
        """Save the checkpoint of `version` (safetensors); drop versions before the newest `keep`
        and any later ones (a previous run's)."""
        path = self.root / f"policy-v{version}"
        staging = self.root / f".policy-v{version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(path, ignore_errors=True)
        staging.rename(path)  # a server never reads a half-written directory
        for other in self.root.glob("policy-v*"):
            number = int(other.name.removeprefix("policy-v"))
            # Older than the newest `keep`, or left by an earlier run of the job with higher numbers.
            if number <= version - self.keep or number > version:
                shutil.rmtree(other, ignore_errors=True)
        return path

    def load_into(self, servers: Sequence[str], path: Path, version: int) -> None:
        """Have every server load the checkpoint; PublishFailed names the servers that did not."""
        failed = []
        for url in servers:
            body = {"model_path": str(path), "weight_version": str(version)}
            try:
                answer = requests.post(f"{url}/update_weights_from_disk", json=body, timeout=self.timeout_s)
                if answer.status_code != 200 or not answer.json().get("success", False):
                    failed.append(f"{url}: {answer.text[:300]}")
            except requests.RequestException as err:
                failed.append(f"{url}: {err}")
        if failed:
            raise PublishFailed(f"policy v{version} not loaded by: {'; '.join(failed)}")
