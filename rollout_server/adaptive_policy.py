"""TLT's speculation policy inside SGLang: the bandit of `tlt.speculation` behind the policy interface
of SGLang's adaptive EAGLE worker (`--speculative-adaptive`).

SGLang's adaptive worker already holds one runtime state per draft length (0 = speculation off,
the target verifies one token and the drafter's KV cache stays warm) and switches between them
between decode steps, asking its policy `get_steps_for_batch(batch_size)` before each step and
reporting `on_verify_complete(...)` after it. Its stock policy follows an average of accepted
lengths; ours picks the draft length with the best measured accepted tokens per second per
batch-size bucket, which is what makes speculation turn off for large batches and on in the tail.

The plugin installs `BanditSpecPolicy` in place of SGLang's `AdaptiveSpeculativeParams` (same
constructor). Its configuration travels in SGLang's adaptive config file, under the key `tlt`
(SGLang reads only the batch-size keys of that file, from which it sizes its buffers).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_server.cpu import cpu_engine_requested
from rollout_server.draft_catch_up import MissedDraftInputs
from rollout_server.history_source import ServerHistory
from tlt.speculation.bandit import BanditConfig, SpecArm, SpeculationBandit
from tlt.speculation.history import HistoryConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)

CONFIG_KEY = "tlt"
HISTORY_KEY = "tlt_history"
# A gap this long between two verify reports is idle time, not a decode step.
MAX_STEP_SECONDS = 2.0


def adaptive_config_file(bandit: BanditConfig, history: HistoryConfig | None = None) -> dict[str, Any]:
    """The content of SGLang's `--speculative-adaptive-config` file for this bandit: one
    batch-size entry whose candidate steps are the arms' draft lengths (what SGLang builds runtime
    states and sizes buffers for; an EAGLE arm and a history arm of one length share a state), the
    bandit's own configuration under `tlt` and the history drafter's under `tlt_history`."""
    steps = sorted({arm.draft_steps for arm in bandit.arms})
    content = {"1": {"candidate_steps": steps}, CONFIG_KEY: bandit.model_dump(mode="json")}
    if history is not None:
        content[HISTORY_KEY] = history.model_dump(mode="json")
    return content


_active: BanditSpecPolicy | None = None


def active_policy() -> BanditSpecPolicy | None:
    """The policy of this scheduler process's adaptive worker (None: no adaptive speculation)."""
    return _active


class SpecMetrics:
    """Prometheus metrics of the policy; exported by SGLang's /metrics with `--enable-metrics`.

    Created in the scheduler process, after SGLang has set PROMETHEUS_MULTIPROC_DIR (read by
    prometheus_client when a metric is created), so that the values reach the HTTP process that
    serves /metrics.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # prometheus_client picks its multiprocess mode at import: import it only here.
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        registry = registry or REGISTRY
        mostrecent = {"multiprocess_mode": "mostrecent", "registry": registry}
        self.enabled = Gauge("tlt_sd_enabled", "1 while the running batch decodes speculatively", **mostrecent)
        self.draft_steps = Gauge("tlt_sd_draft_steps", "draft steps chosen for the running batch (0 = off)", **mostrecent)
        self.batch_size = Gauge("tlt_sd_batch_size", "size of the running decode batch", **mostrecent)
        self.choices = Counter(
            "tlt_sd_choices",
            "decode steps run per batch-size bucket and chosen arm",
            ["bucket", "draft_steps", "source"],
            registry=registry,
        )
        self.accept_length = Histogram(
            "tlt_sd_accept_length",
            "tokens committed per request per speculative step (accepted drafts + 1), per draft source",
            ["source"],
            buckets=[1, 2, 3, 4, 5, 6, 8, 12, 17],
            registry=registry,
        )


@dataclass
class _Step:
    batch: int
    arm: SpecArm
    started: float
    ended: float | None = None
    excluded: float = 0.0  # seconds of the step that belong to earlier steps (a drafter catch-up)


class BanditSpecPolicy:
    """SGLang's adaptive policy interface (`AdaptiveSpecPolicy`) backed by `SpeculationBandit`.

    A step's duration depends on how the engine runs it. SGLang's overlapped scheduler launches
    step k+1 before it reports step k. On a GPU the launch is asynchronous and reporting k waits for
    the device, so the interval between two reports is the duration of the reported step. On the
    CPU the launch computes the whole forward pass (`synchronous_launch`, the default on SGLang's
    CPU engine), and its scheduler does not overlap: it reports step k, processes the results and
    prepares the next batch before launching k+1. A step there lasts from its launch to the next
    launch, so that the per-step cost outside the forward passes is part of every arm's reward; a
    report that arrives before the next launch is credited at that launch.
    """

    def __init__(
        self,
        initial_steps: int,
        cfg_path: str | None = None,
        *,
        metrics: SpecMetrics | None = None,
        synchronous_launch: bool | None = None,
    ) -> None:
        config, history = BanditConfig(), HistoryConfig()
        if cfg_path is not None:
            content = json.loads(Path(cfg_path).read_text())
            config = BanditConfig.model_validate(content[CONFIG_KEY])
            history = HistoryConfig.model_validate(content.get(HISTORY_KEY, {}))
        if any(arm.topk != 1 for arm in config.arms):
            raise ValueError("SGLang's adaptive worker switches chains only: every arm needs topk 1")
        self.bandit = SpeculationBandit(config)
        self._steps = sorted({arm.draft_steps for arm in config.arms})
        # The token history of the served requests, where an arm drafts from it.
        self.history = ServerHistory(history) if any(arm.source == "history" for arm in config.arms) else None
        # What the drafter missed at 0 draft steps (None: it runs at every step, SGLang's way).
        self.missed = MissedDraftInputs(config.catch_up_tokens) if config.catch_up_tokens else None
        self._cuda_graph_bs: list[int] | None = None
        self.synchronous_launch = cpu_engine_requested() if synchronous_launch is None else synchronous_launch
        # Steps launched and not yet reported, oldest first.
        self._pending: deque[_Step] = deque(maxlen=8)
        self._last_report: float | None = None
        # A reported step of the synchronous engine, waiting for the next launch to end it.
        self._reported: tuple[_Step, int] | None = None
        # The arm of the step the latest report belongs to (None: no launched step matched it).
        self.reported_arm: SpecArm | None = None
        self.metrics = metrics
        if self.metrics is None:
            try:
                self.metrics = SpecMetrics()
            except ValueError:  # already registered in this process (a second worker); keep serving
                logger.warning("TLT speculation metrics already registered in this process")
        logger.info("TLT bandit policy: arms %s, initial steps %d", [a.label for a in config.arms], initial_steps)
        global _active
        _active = self

    @property
    def candidate_steps(self) -> list[int]:
        """Draft lengths SGLang must build runtime states for."""
        return list(self._steps)

    @property
    def launching_arm(self) -> SpecArm | None:
        """The arm of the step being launched (chosen by the latest `get_steps_for_batch`)."""
        return self._pending[-1].arm if self._pending else None

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        """The batch sizes SGLang captures CUDA graphs at (None: graphs are off, as on the CPU)."""
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        """Graph sizes the runtime state of `step` draft steps needs: every size for plain decoding,
        for a speculative arm only those up to the bandit's `max_speculative_batch` (it never runs
        above). None: SGLang keeps its own list (graphs off)."""
        if self._cuda_graph_bs is None or step == 0:
            return self._cuda_graph_bs
        cap = self.bandit.config.max_speculative_batch
        covering = next((size for size in self._cuda_graph_bs if size >= cap), None)  # padded up to a graph
        return [size for size in self._cuda_graph_bs if size <= (covering or cap)]

    def get_steps_for_batch(self, batch_size: int) -> int:
        """The draft length of the next decode step of a batch of this size."""
        now = time.perf_counter()
        if self._reported is not None:
            step, tokens = self._reported
            self._reported = None
            self._credit(step, tokens, now - step.started)
        batch = max(batch_size, 1)
        arm = self.bandit.choose(batch)
        if self._pending and self._pending[-1].ended is None:
            self._pending[-1].ended = now
        self._pending.append(_Step(batch, arm, now))
        if self.metrics is not None:
            self.metrics.enabled.set(int(arm.speculative))
            self.metrics.draft_steps.set(arm.draft_steps)
            self.metrics.batch_size.set(batch_size)
            bucket = str(self.bandit.bucket_of(batch))
            self.metrics.choices.labels(bucket=bucket, draft_steps=str(arm.draft_steps), source=arm.source).inc()
        return arm.draft_steps

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> int | None:
        """Credit the arm of the reported step with its committed tokens per second (the step's
        duration includes drafting, verification and scheduling). Returns None: the next step's arm
        is chosen by `get_steps_for_batch`."""
        now = time.perf_counter()
        previous, self._last_report = self._last_report, now
        step = self._pop_step(batch_size)
        self.reported_arm = step.arm if step is not None else None
        if step is None or not num_correct_drafts_per_req:
            return None
        tokens = sum(n + 1 for n in num_correct_drafts_per_req)
        if self.metrics is not None and step.arm.speculative:
            histogram = self.metrics.accept_length.labels(source=step.arm.source)
            for n in num_correct_drafts_per_req:
                histogram.observe(n + 1)
        if not self.synchronous_launch:
            self._credit(step, tokens, now - previous if previous is not None else 0.0)
        elif step.ended is not None:
            self._credit(step, tokens, step.ended - step.started)
        else:
            self._reported = (step, tokens)
        return None

    def exclude_from_step(self, seconds: float) -> None:
        """Leave `seconds` of the step being launched out of its arm's reward: the drafter's catch-up
        is the deferred cost of the steps that ran without it, and charged to the one step that
        resumes drafting it would make a single noisy sample decide against speculation. Only the
        synchronous engine's host time is its compute time, so only there is anything left out."""
        if self.synchronous_launch and self._pending and self._pending[-1].ended is None:
            self._pending[-1].excluded += seconds

    def _credit(self, step: _Step, tokens: int, seconds: float) -> None:
        """Give the bandit a step's measurement, unless its duration says the server sat idle."""
        seconds -= step.excluded
        if 0 < seconds <= MAX_STEP_SECONDS:
            self.bandit.update(step.batch, step.arm, tokens, seconds)

    def _pop_step(self, batch_size: int) -> _Step | None:
        """The oldest launched step of this batch size; older unmatched ones are dropped."""
        while self._pending:
            step = self._pending.popleft()
            if step.batch == max(batch_size, 1):
                return step
        return None
