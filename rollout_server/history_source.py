"""History drafts inside the rollout server: `tlt.speculation.history` fed with the requests the
scheduler serves, and its drafts put where SGLang's EAGLE worker expects its drafter's.

For an arm whose source is history, the plugin lets SGLang's `EagleDraftWorker.draft` run as
usual (it plans the KV slots of the chain, then builds the chain verify input) and answers its
`draft_forward` (the drafter's forward passes) with the history's tokens instead. Verification,
the drafter's extend over the committed tokens (which keeps its KV cache current for later EAGLE
steps) and the policy's feedback are SGLang's, unchanged; the verifier treats every draft as a
point proposal, so a history draft is exactly as lossless as an EAGLE draft.

Requests are grouped by prompt: a `tlt_group` entry in the request's `custom_params` names the
group, else the prompt's token ids do (GRPO's siblings, and a later epoch's samples, share them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rollout_server.sample_recorder import NOT_ROLLOUT_RID_PREFIXES
from tlt.speculation.history import HistoryConfig, HistoryDrafter

GROUP_PARAM = "tlt_group"
_DONE = "_tlt_history_done"  # set on a Req whose end the history has seen (stream_output repeats)


def group_of(req) -> object:
    """The prompt group of a SGLang `Req`: its `custom_params["tlt_group"]`, else its prompt."""
    custom = getattr(req.sampling_params, "custom_params", None) or {}
    group = custom.get(GROUP_PARAM)
    return ("group", str(group)) if group is not None else ("prompt", tuple(req.origin_input_ids))


class ServerHistory:
    """The history drafter of one scheduler process, fed lazily from SGLang's `Req` objects: a
    request is brought up to date (its new output tokens indexed) when a history step drafts for
    its batch and when it finishes, so EAGLE and plain steps pay nothing for it."""

    def __init__(self, config: HistoryConfig | None = None) -> None:
        self.drafter = HistoryDrafter(config)
        self._fed: dict[str, int] = {}  # running request -> output tokens indexed
        self.proposed = 0  # draft tokens proposed from history (the rest of a chain is filler)
        self.requested = 0  # draft positions asked for

    def drafts(self, reqs: Sequence, steps: int, filler: torch.Tensor) -> torch.Tensor:
        """A [len(reqs), steps] chain of draft tokens; where the history has fewer than `steps`
        tokens for a request, the rest comes from `filler` (one token per request: the drafter's
        own first guess, which SGLang computed already)."""
        rows = []
        for req in reqs:
            self._sync(req)
            rows.append(self.drafter.propose(req.rid, steps).tokens)
        chain = filler.reshape(-1, 1).expand(len(reqs), steps).clone()
        for row, tokens in zip(chain, rows, strict=True):
            if tokens:
                row[: len(tokens)] = torch.tensor(tokens, dtype=chain.dtype)
        self.proposed += sum(len(tokens) for tokens in rows)
        self.requested += steps * len(reqs)
        return chain

    def observe_finished(self, reqs: Sequence) -> None:
        """Keep the responses of the finished requests among `reqs` as history (aborted ones are
        dropped; non-rollout generations never enter)."""
        for req in reqs:
            if not req.finished() or getattr(req, _DONE, False) or str(req.rid).startswith(NOT_ROLLOUT_RID_PREFIXES):
                continue
            setattr(req, _DONE, True)
            aborted = type(req.finished_reason).__name__ == "FINISH_ABORT"
            if aborted:
                if self._fed.pop(req.rid, None) is not None:
                    self.drafter.abort(req.rid)
                continue
            self._sync(req, list(req.output_ids_through_stop))
            del self._fed[req.rid]
            self.drafter.finish(req.rid)

    @property
    def running(self) -> int:
        """Requests the history is tracking."""
        return len(self._fed)

    def _sync(self, req, output_ids: Sequence[int] | None = None) -> None:
        fed = self._fed.get(req.rid)
        if fed is None:
            self.drafter.start(req.rid, group_of(req), req.origin_input_ids)
            fed = 0
        output = req.output_ids if output_ids is None else output_ids
        if len(output) > fed:
            self.drafter.extend(req.rid, output[fed:])
        self._fed[req.rid] = max(fed, len(output))


def chain_outputs(chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    """What `EagleDraftWorker.draft_forward` returns for a top-1 chain of `chain`'s tokens:
    (parent list, top-score indices, draft tokens, no draft probabilities). A chain's parents are
    -1, 0, .., steps - 2 (none for one step) and its scores select every step in order, as SGLang's
    preallocated top-1 layout has them."""
    batch, steps = chain.shape
    parent_width = steps if steps > 1 else 0
    parents = torch.arange(-1, parent_width - 1, dtype=torch.long, device=chain.device).repeat(batch, 1)
    scores = torch.arange(steps, dtype=torch.long, device=chain.device).repeat(batch, 1)
    return parents, scores, chain, None
