"""Hot-swapping the EAGLE drafter inside a running rollout server.

A background thread follows the job's drafter weight channel (Redis pub/sub, then a verified pull)
and stages each new version; the scheduler thread applies the staged version right before it runs
its next batch, so no forward pass ever sees half-old, half-new weights. A blob that fails
verification, whose tensor names are not those of the draft checkpoint the server started with
(SGLang's loader skips an unknown name with a warning: a misnamed blob would count as swapped
while changing nothing), or that does not fit the draft model, is rejected and the old drafter
keeps serving. Tensors the EAGLE draft shares with the policy (embedding, LM head) are never
written: such names are dropped from every blob. On a GPU the swap waits for the device first:
without the overlap scheduler's guarantee, the previous batch may still run on its stream.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tlt.models.hf_checkpoint import tensor_files
from tlt.store.connection import RedisSettings
from tlt.store.weight_channel import BadBlob, WeightChannel, WeightManifest

logger = logging.getLogger(__name__)

DRAFTER_JOB_ENV = "TLT_DRAFTER_JOB"
SHARED_WITH_POLICY = ("embed_tokens", "lm_head")


def _own_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if not any(s in name for s in SHARED_WITH_POLICY)}


def _own(names) -> set[str]:
    return {name for name in names if not any(s in name for s in SHARED_WITH_POLICY)}


def _wait_for_device(models: list[nn.Module]) -> None:
    """Let every kernel queued on the models' GPUs finish (the previous batch's forward included)."""
    devices = {p.device for m in models for p in m.parameters() if p.device.type == "cuda"}
    for device in devices:
        torch.cuda.synchronize(device)


class SwapMetrics:
    """Prometheus metrics of the swapper (created lazily: see `adaptive_policy.SpecMetrics`)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.version = Gauge("tlt_drafter_version", "drafter version serving (0 = the one loaded at start)", multiprocess_mode="mostrecent")
        self.swaps = Counter("tlt_drafter_swaps", "drafter versions swapped in")
        self.rejected = Counter("tlt_drafter_rejected", "drafter versions rejected (bad blob or no fit)")


class DrafterSwapper:
    """Follows one weight channel and applies new versions to the draft models on request."""

    def __init__(
        self,
        channel: WeightChannel,
        draft_models: Callable[[], list[nn.Module]],
        metrics: SwapMetrics | None = None,
        expected_names: set[str] | None = None,
    ) -> None:
        """`expected_names`: the tensor names of the draft checkpoint the server loaded at start;
        a version with other names is refused."""
        self.channel = channel
        self.draft_models = draft_models
        self.metrics = metrics
        self.expected_names = _own(expected_names) if expected_names is not None else None
        self.version: int | None = None
        self.rejected: list[int] = []
        self._staged: tuple[WeightManifest, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="tlt-drafter-swap", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                # The latest first: a version may have been announced while we were not subscribed.
                self.fetch(self.channel.latest_version())
                for version in self.channel.announcements(timeout_s=1.0):
                    self.fetch(version)
            except Exception:  # Redis down or restarting: keep serving, retry
                logger.exception("TLT drafter channel unavailable; retrying")
                self._stop.wait(1.0)

    def fetch(self, version: int | None) -> None:
        """Pull and verify `version` and stage it, unless it is not newer than what we have."""
        if version is None or (self.version is not None and version <= self.version) or version in self.rejected:
            return
        with self._lock:
            if self._staged is not None and self._staged[0].version >= version:
                return
        try:
            manifest, tensors = self.channel.load(version)
        except BadBlob as err:
            self._reject(version, str(err))
            return
        own = {name: t for name, t in tensors.items() if not any(s in name for s in SHARED_WITH_POLICY)}
        if len(own) != len(tensors):
            logger.warning("TLT drafter v%d: dropped tensors shared with the policy", version)
        if self.expected_names is not None and set(own) != self.expected_names:
            missing, unknown = sorted(self.expected_names - set(own)), sorted(set(own) - self.expected_names)
            self._reject(version, f"tensor names differ from the served draft's (missing {missing[:5]}, unknown {unknown[:5]})")
            return
        with self._lock:
            self._staged = (manifest, own)

    def _reject(self, version: int, reason: str) -> None:
        logger.error("TLT drafter v%d rejected, the current drafter keeps serving: %s", version, reason)
        self.rejected.append(version)
        if self.metrics is not None:
            self.metrics.rejected.inc()

    def apply_pending(self) -> bool:
        """Apply the staged version, if any (call between two batches); returns whether it did."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is None:
            return False
        manifest, tensors = staged
        models = self.draft_models()
        _wait_for_device(models)  # no kernel of the last batch may read a tensor we now copy or write
        snapshots = [{name: p.detach().clone() for name, p in _own_parameters(m).items()} for m in models]
        try:
            for model in models:
                model.load_weights(list(tensors.items()))
            _wait_for_device(models)
        except Exception as err:  # noqa: BLE001 (any loader error: undo, keep the old drafter)
            for model, snapshot in zip(models, snapshots):
                params = _own_parameters(model)
                with torch.no_grad():
                    for name, value in snapshot.items():
                        params[name].copy_(value)
            self._reject(manifest.version, f"does not fit the draft model ({err})")
            return False
        self.version = manifest.version
        logger.info("TLT drafter v%d swapped in", manifest.version)
        if self.metrics is not None:
            self.metrics.version.set(manifest.version)
            self.metrics.swaps.inc()
        return True


def draft_models_of(scheduler) -> list[nn.Module]:
    """The EAGLE draft models of an SGLang scheduler (one per draft runner)."""
    spec_worker = scheduler.draft_worker
    draft_worker = spec_worker.draft_worker
    runners = getattr(draft_worker, "draft_runners", None) or [draft_worker.draft_runner]
    return [runner.model for runner in runners]


def swapper_for(scheduler) -> DrafterSwapper | None:
    """A started swapper for this scheduler when the launcher named a drafter job, else None."""
    job = os.environ.get(DRAFTER_JOB_ENV)
    if not job or getattr(scheduler, "draft_worker", None) is None:
        return None
    channel = WeightChannel(RedisSettings().client(), job, "drafter")
    served = Path(scheduler.server_args.speculative_draft_model_path)
    swapper = DrafterSwapper(channel, lambda: draft_models_of(scheduler), SwapMetrics(), set(tensor_files(served)))
    swapper.start()
    logger.info("TLT drafter swap following job %s", job)
    return swapper
