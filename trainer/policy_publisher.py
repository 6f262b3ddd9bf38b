"""Publishing a policy version to the rollout servers, over one of three channels:

- disk (large policies): the trainer writes an HF checkpoint into a directory the servers can read
  (one machine; a shared volume on a cluster) and has each server load it with SGLang's
  `/update_weights_from_disk`;
- Redis (small policies, no shared volume): the trainer publishes the checkpoint's safetensors to
  the job's `policy` weight channel; each server's policy follower verifies it, writes it locally
  and loads it the same way;
- distributed (`trainer.weight_broadcast`): the trainer and the servers join one torch.distributed
  group and the version is broadcast to all of them (NCCL on GPUs, gloo on the CPU).

Every way a version is tagged on the server (SGLang's `weight_version`, returned with every
generation), so the trainer can check that a step's samples all come from one version."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import requests
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.models.hf_checkpoint import save_in_dtype
from tlt.rollout.client import load_weights_from_disk, model_info
from tlt.store.weight_channel import POLICY_VERSION_KEY, WeightChannel


class PublishFailed(RuntimeError):
    """A server refused or failed to load a policy version."""


class PolicyPublisher(Protocol):
    """A policy channel: `write` makes a version available, `load_into` has servers serve it."""

    def write(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int, weights: dict[str, torch.Tensor] | None = None
    ) -> str: ...

    def load_into(self, servers: Sequence[str], location: str, version: int) -> None: ...


def served_version(url: str) -> str | None:
    """The policy version the server says it serves (SGLang's weight_version)."""
    return model_info(url).get("weight_version")


class DiskPolicyPublisher:
    """Writes `policy-v{N}` checkpoints under `root` (keeping the newest `keep`) in the servers'
    dtype and loads them into servers."""

    def __init__(self, root: Path, keep: int = 2, timeout_s: float = 600.0, dtype: torch.dtype = torch.float32) -> None:
        self.root, self.keep, self.timeout_s, self.dtype = root, keep, timeout_s, dtype
        root.mkdir(parents=True, exist_ok=True)

    def write(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int, weights: dict[str, torch.Tensor] | None = None
    ) -> str:
        """Save the checkpoint of `version` (safetensors; `weights`: the full weights of a sharded
        model); drop versions before the newest `keep` and any later ones (a previous run's).
        Returns its directory."""
        path = self.root / f"policy-v{version}"
        staging = self.root / f".policy-v{version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        save_in_dtype(model, staging, self.dtype, weights)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(path, ignore_errors=True)
        staging.rename(path)  # a server never reads a half-written directory
        for other in self.root.glob("policy-v*"):
            number = int(other.name.removeprefix("policy-v"))
            # Older than the newest `keep`, or left by an earlier run of the job with higher numbers.
            if number <= version - self.keep or number > version:
                shutil.rmtree(other, ignore_errors=True)
        return str(path)

    def load_into(self, servers: Sequence[str], location: str, version: int) -> None:
        """Have every server load the checkpoint; PublishFailed names the servers that did not."""
        failed = []
        for url in servers:
            try:
                if (refusal := load_weights_from_disk(url, location, str(version), self.timeout_s)) is not None:
                    failed.append(f"{url}: {refusal[:300]}")
            except requests.RequestException as err:
                failed.append(f"{url}: {err}")
        if failed:
            raise PublishFailed(f"policy v{version} not loaded by: {'; '.join(failed)}")


class RedisPolicyPublisher:
    """Publishes versions to the job's `policy` weight channel; the servers' policy followers load
    them. `load_into` waits until the servers say they serve the version."""

    def __init__(self, channel: WeightChannel, timeout_s: float = 120.0, dtype: torch.dtype = torch.float32) -> None:
        self.channel, self.timeout_s, self.dtype = channel, timeout_s, dtype

    def write(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int, weights: dict[str, torch.Tensor] | None = None
    ) -> str:
        """Publish the weights of `version` (one safetensors file, as `save_pretrained` writes it;
        `weights`: the full weights of a sharded model); returns the channel version that carries it."""
        with tempfile.TemporaryDirectory() as tmp:
            save_in_dtype(model, Path(tmp), self.dtype, weights, max_shard_size="1000GB")
            files = list(Path(tmp).glob("*.safetensors"))
            if len(files) != 1:
                raise PublishFailed(f"expected one safetensors file, save_pretrained wrote {len(files)}")
            blob = files[0].read_bytes()
        manifest = self.channel.publish_blob(blob, self.channel.latest_version(), {POLICY_VERSION_KEY: str(version)})
        return str(manifest.version)

    def load_into(self, servers: Sequence[str], location: str, version: int) -> None:
        """Wait until every server serves `version`; PublishFailed names those that did not in time."""
        deadline = time.monotonic() + self.timeout_s
        waiting, unreachable = list(servers), []
        while waiting:
            still = []
            for url in waiting:
                try:
                    if served_version(url) != str(version):
                        still.append(url)
                except requests.ConnectionError:  # down: no use waiting for it
                    unreachable.append(url)
                except requests.RequestException:
                    still.append(url)
            waiting = still
            if waiting and time.monotonic() > deadline:
                unreachable += waiting
                break
            if waiting:
                time.sleep(0.1)
        if unreachable:
            raise PublishFailed(f"policy v{version} (channel v{location}) not served in {self.timeout_s:.0f} s by: {unreachable}")
