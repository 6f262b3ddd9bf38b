"""A real "off" arm: at 0 draft steps the drafter does not run, and catches up when drafting resumes.

SGLang's adaptive EAGLE worker runs a drafter extend after every step, even at 0 draft steps, so
that the drafter's KV cache is current when the batch shrinks and drafting resumes; on our CPU
engine that extend is a fifth of an "off" step. What the extend of position p needs is the
target's hidden state at p and the token committed after it, both known after the verify. The
plugin keeps those inputs instead (`MissedDraftInputs.keep`) and, before the next step that
drafts, runs one drafter extend over every position a request missed (`catch_up`), exactly as a
prefill extends a prompt. The drafter then sees the KV cache it would have built step by step, so
acceptance after the switch is what it would have been.

Outputs cannot change either way: drafts are only ever proposals that the target verifies. A
request that missed more than `max_tokens` positions gets only its latest ones back; the older
ones stay stale, which costs acceptance, never correctness.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch


@dataclass
class _Missed:
    start: int  # position of the first kept input
    hidden: list[torch.Tensor] = field(default_factory=list)  # the target's hidden state per position
    tokens: list[int] = field(default_factory=list)  # the token committed after each position

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class MissedDraftInputs:
    """The drafter inputs of the positions each running request decoded without the drafter."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        self.max_tokens = max_tokens
        self._missed: dict[str, _Missed] = {}

    def __len__(self) -> int:
        return len(self._missed)

    def keep(self, rids: list[str], positions: list[int], hidden: torch.Tensor, tokens: list[int]) -> None:
        """Record one step of the running batch: request `rids[i]` decoded position `positions[i]`,
        with target hidden state `hidden[i]`, and committed `tokens[i]` after it. Requests that
        are not in the batch any more are forgotten; a request whose positions are not contiguous
        (it was retracted and prefilled again) starts over."""
        missed = {}
        for rid, position, row, token in zip(rids, positions, hidden.unbind(0), tokens, strict=True):
            entry = self._missed.get(rid)
            if entry is None or entry.end != position:
                entry = _Missed(start=position)
            entry.hidden.append(row)
            entry.tokens.append(token)
            if len(entry.tokens) > self.max_tokens:
                del entry.hidden[0], entry.tokens[0]
                entry.start += 1
            missed[rid] = entry
        self._missed = missed

    def forget(self, rids: list[str]) -> None:
        """Drop these requests' inputs (a prefill extends the drafter over their whole sequence)."""
        for rid in rids:
            self._missed.pop(rid, None)

    def take(self, rids: list[str], seq_lens: list[int]) -> list[tuple[int, _Missed]]:
        """Remove and return `(batch index, inputs)` for the requests of a batch about to draft
        whose kept positions end where their sequence does (`seq_lens[i]` tokens are cached)."""
        taken = []
        for i, (rid, seq_len) in enumerate(zip(rids, seq_lens, strict=True)):
            entry = self._missed.pop(rid, None)
            if entry is not None and entry.end == seq_len:
                taken.append((i, entry))
        return taken


def catch_up(worker, batch, taken: list[tuple[int, _Missed]]) -> None:
    """Run one drafter extend (SGLang's `EagleDraftWorker._draft_extend_for_prefill`) over the
    missed positions of the requests in `taken`, and put its result (the first draft token's top-k
    and the drafter's hidden state) into their rows of `batch.spec_info`, which the draft reads."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    rows = [i for i, _ in taken]
    index = torch.tensor(rows, dtype=torch.long, device=batch.seq_lens.device)
    lengths = [len(entry.tokens) for _, entry in taken]
    pool = batch.req_pool_indices[index]
    req_to_token = worker.draft_runner.req_to_token_pool.req_to_token
    slots = [req_to_token[int(p), entry.start : entry.end] for p, (_, entry) in zip(pool.tolist(), taken, strict=True)]
    # _draft_extend_for_prefill shifts each request's ids left by one and appends its next token:
    # feeding (anything, t_1..t_{m-1}) with next token t_m gives the drafter t_1..t_m.
    shifted = [token for _, entry in taken for token in (0, *entry.tokens[:-1])]

    sub = copy.copy(batch)
    sub.reqs = [batch.reqs[i] for i in rows]
    sub.forward_mode = ForwardMode.EXTEND
    sub.req_pool_indices = pool
    sub.req_pool_indices_cpu = pool.cpu()
    sub.seq_lens = batch.seq_lens[index]
    sub.seq_lens_cpu = sub.seq_lens.cpu()
    sub.seq_lens_sum = int(sub.seq_lens_cpu.sum())
    sub.orig_seq_lens = batch.orig_seq_lens[index] if batch.orig_seq_lens is not None else None
    sub.prefix_lens = [entry.start for _, entry in taken]
    sub.extend_lens = lengths
    sub.extend_num_tokens = sum(lengths)
    sub.extend_logprob_start_lens = lengths
    sub.out_cache_loc = torch.cat(slots).to(torch.int64)
    sub.input_ids = torch.tensor(shifted, dtype=torch.int64, device=batch.seq_lens.device)
    sub.sampling_info = copy.copy(batch.sampling_info)
    sub.spec_info = None
    for name in ("chunked_req", "chunked_req_next_prompt_token", "decoding_reqs", "multimodal_inputs", "input_embeds",
                 "top_logprobs_nums", "token_ids_logprobs", "extend_input_logprob_token_ids"):  # fmt: skip
        setattr(sub, name, None)
    sub.return_logprob = sub.has_grammar = sub.is_extend_in_batch = False
    hidden = torch.stack([row for _, entry in taken for row in entry.hidden])
    last_tokens = torch.tensor([entry.tokens[-1] for _, entry in taken], dtype=torch.int64, device=batch.seq_lens.device)
    result = worker._draft_extend_for_prefill(sub, hidden, last_tokens)

    spec = batch.spec_info
    spec.topk_p = spec.topk_p.clone().index_copy_(0, index, result.topk_p.to(spec.topk_p.dtype))
    spec.topk_index = spec.topk_index.clone().index_copy_(0, index, result.topk_index.to(spec.topk_index.dtype))
    spec.hidden_states = spec.hidden_states.clone().index_copy_(0, index, result.hidden_states.to(spec.hidden_states.dtype))


def stub_draft_extend(worker, batch, next_draft_input) -> None:
    """Shape-valid placeholders for what a skipped drafter extend would have produced (the top-k of
    the first draft token and the drafter's hidden state), as SGLang's own skip does; `catch_up`
    replaces them before any draft reads them."""
    from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

    size = batch.seq_lens.shape[0]
    device = batch.seq_lens.device
    next_draft_input.topk_p = torch.zeros((size, worker.topk), dtype=torch.float32, device=device)
    next_draft_input.topk_index = torch.zeros((size, worker.topk), dtype=torch.int64, device=device)
    hidden_size, hidden_dtype = get_draft_recurrent_hidden_state_spec(worker.draft_runner)
    if hidden_size is not None:
        next_draft_input.hidden_states = torch.zeros((size, hidden_size), dtype=hidden_dtype, device=device)
