"""Pure-PyTorch versions of the three attention ops of SGLang's `intel_amx` attention backend.

That backend is SGLang's only CPU attention backend with a speculative-decoding path (target
verify with a tree mask, multi-step draft decode); its C++ kernels live in `sgl_kernel`'s CPU build,
which PyPI does not ship. These functions keep the argument order and in-place contract of the C++
ops as `intel_amx_backend.py` calls them, so the backend runs unchanged on any CPU.

Both attention ops gather each sequence's keys and values through `req_to_token`, pad the batch to
its longest sequence and compute masked softmax attention in float32 with PyTorch's fused kernel: a
handful of tensor ops per call instead of a Python loop per sequence, which is what keeps SD's
extra forward passes cheap on a small model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Upper bound on the float32 score cells one extend chunk materialises (about 256 MiB).
_EXTEND_SCORE_BUDGET = 64 * 1024 * 1024


def _check_supported(
    is_cross_attention: bool, sliding_window_size: int, encoder_lens: torch.Tensor | None, sinks: torch.Tensor | None
) -> None:
    # The models TLT trains (Qwen2/Llama families) use none of these; failing loudly beats a
    # silently different attention.
    if is_cross_attention or encoder_lens is not None:
        raise NotImplementedError("TLT's CPU attention ops do not support cross-attention")
    if sliding_window_size > 0:
        raise NotImplementedError("TLT's CPU attention ops do not support sliding-window attention")
    if sinks is not None:
        raise NotImplementedError("TLT's CPU attention ops do not support attention sinks")


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, sm_scale: float, logit_cap: float
) -> torch.Tensor:
    """Masked softmax attention with grouped KV heads, in float32.

    q: [B, Q, H, D]; k: [B, K, Hkv, D]; v: [B, K, Hkv, Dv]; visible: [B, Q, K] bool.
    Returns [B, Q, H, Dv] in q's dtype. Rows with no visible key (padding) are the caller's to drop.
    """
    if logit_cap > 0:
        return _attend_capped(q, k, v, visible, sm_scale, logit_cap)
    # PyTorch's fused CPU kernel is 2-3x faster per call than matmul-mask-softmax-matmul on the
    # small shapes of speculative steps (profiled: attention was a quarter of target verify).
    out = F.scaled_dot_product_attention(
        q.float().transpose(1, 2),
        k.float().transpose(1, 2),
        v.float().transpose(1, 2),
        attn_mask=visible[:, None],
        scale=sm_scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2).to(q.dtype)


def _attend_capped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, sm_scale: float, logit_cap: float
) -> torch.Tensor:
    """`_attend` with tanh soft-capped scores, which the fused kernel cannot apply."""
    batch, num_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_heads // num_kv_heads
    # [B, Hkv, group * Q, D]: the query heads sharing a KV head are stacked so one matmul serves them.
    qg = q.float().view(batch, num_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(batch, num_kv_heads, group * num_q, head_dim)
    scores = torch.matmul(qg, k.float().permute(0, 2, 3, 1)) * sm_scale
    scores = logit_cap * torch.tanh(scores / logit_cap)
    mask = visible[:, None, None, :, :].expand(batch, 1, group, num_q, k.shape[1])
    scores = scores.view(batch, num_kv_heads, group, num_q, -1).masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(batch, num_kv_heads, group * num_q, -1)
    out = torch.matmul(probs, v.float().transpose(1, 2))
    out = out.view(batch, num_kv_heads, group, num_q, -1).permute(0, 3, 1, 2, 4)
    return out.reshape(batch, num_q, num_heads, -1).to(q.dtype)


def _prefix_slots(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slots of each sequence's first `lengths[b]` tokens, padded with slot 0: ([B, L], valid [B, L])."""
    width = int(lengths.max()) if lengths.numel() else 0
    positions = torch.arange(width, device=lengths.device)
    valid = positions[None, :] < lengths[:, None]
    slots = req_to_token[req_pool_indices.long(), :width].long()
    return slots.masked_fill(~valid, 0), valid


def _gather_rows(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`buffer[slots]` for a 2-D slot tensor, through `index_select` on the flattened slots.

    Measured at batch 64 on the bundled model's KV shapes: 5x faster than advanced indexing,
    which took 69% of a decode attention call.
    """
    return buffer.index_select(0, slots.reshape(-1)).view(*slots.shape, *buffer.shape[1:])


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key_scale: float,
    value_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One query token per sequence against its whole cached sequence.

    When `key`/`value` are given they are first written to the cache at `loc` (the C++ op fuses
    that write). Sequence b attends to the tokens at `req_to_token[req_pool_indices[b],
    :seq_lens[b]]`, which include the current one. Writes `output` [B, H, Dv]; `attn_logits` is the
    C++ op's split-K scratch space and is not needed here.
    """
    del attn_logits
    _check_supported(is_cross_attention, sliding_window_size, encoder_lens, sinks)
    if key_scale != 1.0 or value_scale != 1.0:
        raise NotImplementedError("TLT's CPU attention ops do not support scaled (fp8) KV caches")
    if key is not None and value is not None:
        k_cache[loc] = key.reshape(-1, *k_cache.shape[1:]).to(k_cache.dtype)
        v_cache[loc] = value.reshape(-1, *v_cache.shape[1:]).to(v_cache.dtype)
    slots, valid = _prefix_slots(req_to_token, req_pool_indices, seq_lens)
    out = _attend(query.unsqueeze(1), _gather_rows(k_cache, slots), _gather_rows(v_cache, slots), valid.unsqueeze(1), sm_scale, logit_cap)
    output.copy_(out.squeeze(1))


def _extend_chunks(prefix_lens: list[int], extend_lens: list[int], num_heads: int) -> list[tuple[int, int]]:
    """Split the batch into [start, end) runs whose padded score tensor stays within budget."""
    chunks, start, max_prefix, max_extend = [], 0, 0, 0
    for b, (prefix, extend) in enumerate(zip(prefix_lens, extend_lens)):
        new_prefix, new_extend = max(max_prefix, prefix), max(max_extend, extend)
        cells = (b - start + 1) * num_heads * new_extend * (new_prefix + new_extend)
        if b > start and cells > _EXTEND_SCORE_BUDGET:
            chunks.append((start, b))
            start, new_prefix, new_extend = b, prefix, extend
        max_prefix, max_extend = new_prefix, new_extend
    if start < len(prefix_lens):
        chunks.append((start, len(prefix_lens)))
    return chunks


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Several new tokens per sequence against the sequence's cached prefix and each other.

    Sequence b has `extend_seq_lens[b]` new tokens at rows `extend_start_loc[b]...` of the packed
    `q_extend`/`k_extend`/`v_extend`, after a cached prefix of `seq_lens[b] - extend_seq_lens[b]`
    tokens read through `req_to_token`. Every new token sees the whole prefix; among the new
    tokens it sees those before it (`is_causal`), all of them (not causal), or, in speculative
    verification, those `tree_mask` allows: a flat bool [B * n * n] whose cell `b*n*n + i*n + j`
    says whether draft token i sees draft token j (SGLang's QLEN_ONLY layout). Writes `o_extend`.
    """
    del max_len_extend  # recomputed per chunk
    _check_supported(is_cross_attention, sliding_window_size, encoder_lens, sinks)
    if key_scale != 1.0 or value_scale != 1.0:
        raise NotImplementedError("TLT's CPU attention ops do not support scaled (fp8) KV caches")
    extend_lens = extend_seq_lens.long()
    prefix_lens = seq_lens.long() - extend_lens
    starts = extend_start_loc.long()
    extend_list = extend_lens.tolist()
    if k_extend is not None and v_extend is not None and extend_list and set(extend_list) == {1}:
        # One new token per sequence (a verify at 0 draft steps, a drafter extend after one token):
        # it sees its prefix and itself whatever the mask, so decode's few ops suffice. The general
        # path's masks cost 2 ms per layer at batch 1 in Python overhead alone (profiled).
        _extend_one_token(
            q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_token,
            req_pool_indices, prefix_lens, starts, sm_scale, logit_cap,
        )  # fmt: skip
        return
    chunks = _extend_chunks(prefix_lens.tolist(), extend_list, q_extend.shape[1])
    for lo, hi in chunks:
        _extend_chunk(
            q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_token,
            req_pool_indices[lo:hi], prefix_lens[lo:hi], extend_lens[lo:hi], starts[lo:hi],
            lo, sm_scale, logit_cap, tree_mask, is_causal,
        )  # fmt: skip


def _extend_one_token(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    starts: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
) -> None:
    """`extend_attention_cpu` when every sequence extends by exactly one token."""
    slots, valid = _prefix_slots(req_to_token, req_pool_indices, prefix_lens + 1)
    seqs = torch.arange(len(prefix_lens))
    slots[seqs, prefix_lens] = 0  # the new token's column is filled from k_extend below
    keys, values = _gather_rows(k_buffer, slots), _gather_rows(v_buffer, slots)
    keys[seqs, prefix_lens] = k_extend[starts].to(keys.dtype)
    values[seqs, prefix_lens] = v_extend[starts].to(values.dtype)
    out = _attend(q_extend[starts].unsqueeze(1), keys, values, valid.unsqueeze(1), sm_scale, logit_cap)
    o_extend[starts] = out.squeeze(1).to(o_extend.dtype)


def _extend_chunk(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    starts: torch.Tensor,
    first_seq: int,
    sm_scale: float,
    logit_cap: float,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    max_extend = int(extend_lens.max())
    offsets = torch.arange(max_extend)
    query_valid = offsets[None, :] < extend_lens[:, None]
    rows = (starts[:, None] + offsets[None, :]).masked_fill(~query_valid, 0)

    # One gather over prefix and new tokens together; the new tokens' keys are then written into
    # their columns. Appending them with a cat copied the whole gathered prefix a second time
    # (profiled: 42% of a one-token extend).
    total_lens = prefix_lens + extend_lens
    cached_lens = total_lens if k_extend is None or v_extend is None else prefix_lens
    slots, _ = _prefix_slots(req_to_token, req_pool_indices, total_lens)
    columns = torch.arange(slots.shape[1])
    slots = slots.masked_fill(columns[None, :] >= cached_lens[:, None], 0)
    keys, values = _gather_rows(k_buffer, slots), _gather_rows(v_buffer, slots)
    if k_extend is not None and v_extend is not None:
        seq_idx = torch.arange(len(extend_lens))[:, None].expand_as(rows)[query_valid]
        new_cols = (prefix_lens[:, None] + offsets[None, :])[query_valid]
        keys[seq_idx, new_cols] = k_extend[rows[query_valid]].to(keys.dtype)
        values[seq_idx, new_cols] = v_extend[rows[query_valid]].to(values.dtype)
    # KV-shared layers pass no new keys: theirs are already in the cache after the prefix.

    among_new = query_valid[:, None, :].expand(-1, max_extend, -1)
    if tree_mask is not None:
        n = max_extend
        per_seq = tree_mask.view(-1, n, n)[first_seq : first_seq + len(extend_lens)]
        among_new = among_new & per_seq.bool()
    elif is_causal:
        among_new = among_new & torch.ones(max_extend, max_extend, dtype=torch.bool).tril()
    rel = columns[None, :] - prefix_lens[:, None]
    is_new = (rel >= 0) & (rel < extend_lens[:, None])
    sees_new = among_new.gather(2, rel.clamp(0, max_extend - 1)[:, None, :].expand(-1, max_extend, -1))
    visible = (rel < 0)[:, None, :] | (is_new[:, None, :] & sees_new)

    out = _attend(q_extend[rows], keys, values, visible, sm_scale, logit_cap)
    o_extend[rows[query_valid]] = out[query_valid].to(o_extend.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """`req_to_token` expanded for multi-step draft decoding with `topk` candidates per request.

    Row `b * topk + t` holds request b's committed prefix (its first `seq_lens[b]` slots) followed
    by candidate t's `num_steps` draft slots, which SGLang lays out at `seq_lens[b] + t *
    num_steps` of the request's row. Only the first `seq_lens[b] + num_steps` entries of a row are
    meaningful. Returns [num_seqs * topk, pool_len] in req_to_token's dtype.
    """
    rows = req_to_token[req_pool_indices.long(), :pool_len]
    expanded = rows.repeat_interleave(topk, dim=0)
    steps = torch.arange(num_steps)
    lens = seq_lens.long()
    candidates = torch.arange(topk)
    src = lens[:, None, None] + candidates[None, :, None] * num_steps + steps[None, None, :]
    drafts = rows.gather(1, src.reshape(len(lens), -1).clamp(max=pool_len - 1)).view(-1, num_steps)
    dest = (lens[:, None] + steps[None, :]).repeat_interleave(topk, dim=0).clamp(max=pool_len - 1)
    return expanded.scatter_(1, dest, drafts)
