"""`python -m rollout_server.policy_follower`: beside a rollout server, follows the job's `policy`
weight channel in Redis (the channel for small policies: no shared volume needed). Each new version
is verified (size, sha256, tensor index), written as an HF checkpoint in a local directory (the
weights from Redis, config and tokenizer from the server's base checkpoint) and loaded with the
server's `/update_weights_from_disk`, tagged with the trainer's version number. A bad blob is
rejected and the server keeps its current weights."""

from __future__ import annotations

import logging
import shutil
import signal
import threading
from pathlib import Path

import requests
from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import RedisError

from tlt.rollout.client import load_weights_from_disk
from tlt.settings.common import service_start
from tlt.settings.policy_follower import PolicyFollowerSettings
from tlt.store.weight_channel import POLICY_VERSION_KEY, BadBlob, WeightChannel, WeightManifest

logger = logging.getLogger(__name__)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class FollowerState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    applied: int | None = None  # channel version now served
    rejected: list[int] = Field(default_factory=list)


class PolicyFollower:
    def __init__(self, settings: PolicyFollowerSettings, channel: WeightChannel) -> None:
        self.settings, self.channel = settings, channel
        self.state = FollowerState()
        self._stop = threading.Event()
        settings.work_dir.mkdir(parents=True, exist_ok=True)

    def apply(self, version: int | None) -> bool:
        """Load channel `version` into the server unless it is not newer; whether it was loaded."""
        if version is None or version in self.state.rejected or (self.state.applied is not None and version <= self.state.applied):
            return False
        try:
            manifest, blob = self.channel.read(version)
            policy_version = manifest.metadata.get(POLICY_VERSION_KEY)
            if policy_version is None:
                raise BadBlob(f"policy v{version} carries no {POLICY_VERSION_KEY}")
        except BadBlob as err:
            logger.error("policy channel v%d rejected, the server keeps its weights: %s", version, err)
            self.state.rejected.append(version)
            return False
        path = self._write(manifest, blob)
        if (refusal := load_weights_from_disk(self.settings.server_url, str(path), policy_version)) is not None:
            logger.error("server refused policy v%s: %s", policy_version, refusal)
            self.state.rejected.append(version)
            return False
        self.state.applied = version
        logger.info("serving policy v%s (channel v%d)", policy_version, version)
        self._prune()
        return True

    def _write(self, manifest: WeightManifest, blob: bytes) -> Path:
        """An HF checkpoint directory: the verified weights plus the base's other files."""
        final = self.settings.work_dir / f"policy-c{manifest.version}"
        staging = self.settings.work_dir / f".policy-c{manifest.version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for source in self.settings.base_model_path.iterdir():
            if source.is_file() and not source.name.endswith(WEIGHT_SUFFIXES) and not source.name.endswith(".index.json"):
                shutil.copy2(source, staging / source.name)
        (staging / "model.safetensors").write_bytes(blob)
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        return final

    def _prune(self, keep: int = 2) -> None:
        versions = sorted(int(p.name.removeprefix("policy-c")) for p in self.settings.work_dir.glob("policy-c*"))
        for version in versions[:-keep]:
            shutil.rmtree(self.settings.work_dir / f"policy-c{version}", ignore_errors=True)

    def run_forever(self) -> None:
        """Apply the latest version, then each announced one, until `stop()`; Redis or server
        outages are waited out."""
        while not self._stop.is_set():
            try:
                self.apply(self.channel.latest_version())
                for version in self.channel.announcements(timeout_s=1.0):
                    self.apply(version)
                    if self._stop.is_set():
                        break
            except (requests.RequestException, OSError) as err:
                logger.warning("policy follower: %s; retrying", err)
                self._stop.wait(1.0)
            except RedisError as err:  # Redis restarting: keep serving, retry
                logger.warning("policy channel unavailable (%s); retrying", err)
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()


def main(argv: list[str] | None = None) -> None:
    settings, client = service_start(PolicyFollowerSettings, "policy_follower", argv)
    channel = WeightChannel(client, settings.job_id, "policy", max_bytes=settings.max_bytes)
    follower = PolicyFollower(settings, channel)
    signal.signal(signal.SIGTERM, lambda *_: follower.stop())
    follower.run_forever()


if __name__ == "__main__":
    main()
