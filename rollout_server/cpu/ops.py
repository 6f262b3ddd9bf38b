"""Pure-PyTorch versions of the `sgl_kernel` CPU index ops that SGLang's CPU path calls.

SGLang's CPU engine imports these from `sgl_kernel`, whose PyPI wheels hold only CUDA code. Each
function keeps the argument order and in-place contract of the C++ op it stands in for (see the
Triton twin of each in `sglang/kernels/ops/...`), so SGLang calls them unchanged.
"""

from __future__ import annotations

import ctypes

import torch


def _segment_bounds(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int, int]]:
    """(start, end, offset into the packed output) per request; segments are packed in order."""
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    out, packed = [], 0
    for start, end in zip(starts, ends):
        out.append((start, end, packed))
        packed += end - start
    return out


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's newly allocated KV slots into its row of `req_to_token`.

    Request i owns `out_cache_loc[packed_i : packed_i + end_i - start_i]`, written to
    `req_to_token[req_pool_indices[i], start_i:end_i]`.
    """
    del pool_len  # the row width; implied by req_to_token's shape here
    for row, (start, end, packed) in zip(req_pool_indices.tolist(), _segment_bounds(start_offset, end_offset)):
        req_to_token[row, start:end] = out_cache_loc[packed : packed + end - start].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse gather: read `req_to_token[row, start:end]` of each request into the packed
    `out_cache_loc`."""
    del pool_len
    for row, (start, end, packed) in zip(req_pool_indices.tolist(), _segment_bounds(start_offset, end_offset)):
        out_cache_loc[packed : packed + end - start] = req_to_token[row, start:end].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Copy each request's `topk * num_steps` draft slots, from its current length on, into
    `out_cache_loc` (request i at `i * topk * num_steps`)."""
    del pool_len
    width = topk * num_steps
    rows = req_pool_indices.long()
    cols = seq_lens.long().unsqueeze(1) + torch.arange(width, device=seq_lens.device)
    gathered = req_to_token[rows.unsqueeze(1), cols]
    out_cache_loc[: rows.numel() * width] = gathered.reshape(-1).to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """The last accepted token of each request (the bonus token) into `bonus_tokens`."""
    flat = accept_tokens.reshape(-1)
    batch = accept_lens.numel()
    index = torch.arange(batch, device=flat.device) * accept_stride + accept_lens.long() - 1
    bonus_tokens[:batch] = flat[index].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact the KV slots of accepted draft positions (`accept_index != -1`, in order) to the
    front of `accept_out_cache_loc`."""
    flat = accept_index.reshape(-1)
    kept = flat[flat != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy token row `src_loc[j]` to `tgt_loc[j]` in every KV buffer of every layer.

    The op receives raw buffer addresses (as SGLang's KV pool exposes them) and the byte size of
    one token row per buffer, so the copy works on memory, not tensors; all rows are read before
    any is written, which keeps overlapping moves correct as on the GPU.
    """
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    if not pairs:
        return
    for base, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + src * row_bytes, row_bytes) for _, src in pairs]
        for (tgt, _), row in zip(pairs, rows):
            ctypes.memmove(base + tgt * row_bytes, row, row_bytes)


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each request's extend segment of `input_ids` left by one and write its new token
    (`topk_index[i]`) at the segment's last position, or at `select_index[i]` when given."""
    new_tokens = topk_index.reshape(-1).tolist()
    starts = extend_start_loc.tolist()
    lens = extend_seq_lens.tolist()
    targets = select_index.tolist() if select_index is not None else None
    for i, (start, length) in enumerate(zip(starts, lens)):
        if length <= 0:
            continue
        input_ids[start : start + length - 1] = input_ids[start + 1 : start + length].clone()
        last = targets[i] if targets is not None else start + length - 1
        input_ids[last] = new_tokens[i]


def _speculative_tree_op_unavailable(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: EAGLE tree building/verification is not available on the CPU "
            "engine yet; run without --speculative-algorithm"
        )

    op.__name__ = name
    return op


# SGLang imports these at start-up even with speculative decoding off; they run only with EAGLE,
# which the CPU launcher refuses until the tree ops exist (rollout_server.launch).
build_tree_kernel_efficient_cpu = _speculative_tree_op_unavailable("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _speculative_tree_op_unavailable("verify_tree_greedy_cpu")
