"""Pure-PyTorch versions of the `sgl_kernel` CPU index and EAGLE-tree ops that SGLang's CPU path
calls.

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


FULL_MASK, QLEN_ONLY = 0, 1  # sglang TreeMaskMode values this op writes


def _parent_slot(draft_slot: int, selected: list[int], parents: list[int], slots: dict[int, int], topk: int):
    """Slot (0-based among the drafts) of a draft's parent: None when the parent is the root, -1 when
    the parent is not among the selected drafts (its first occurrence in `slots` otherwise)."""
    quotient = selected[draft_slot] // topk
    if quotient == 0:
        return None
    return slots.get(parents[quotient], -1)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build each request's EAGLE draft tree from the drafter's top-scoring candidates.

    `selected_index[b, i-1]` names draft token i (1 <= i < draft_token_num; token 0 is the verified
    root); `selected_index // topk` indexes `parent_list[b]`, whose entry is the parent's own
    selected index (its parent is the root when the quotient is 0). Writes, per request:
    first-child / next-sibling links (`retrieve_next_token`, `retrieve_next_sibling`, pre-filled
    with -1 by the caller), flat token ids (`retrieve_index`), each token's position (root at the
    verified length, a child one deeper than its parent) and the tree-attention mask (each token sees
    the root and its ancestors), either over the whole sequence (FULL_MASK) or over the draft
    tokens only (QLEN_ONLY).
    """
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(f"tree mask mode {tree_mask_mode} (bit-packed) is not supported on the CPU")
    n = draft_token_num
    seq_lens = verified_seq_len.tolist()
    prefix = 0
    mask = tree_mask.view(-1)
    flat_positions = positions.view(-1)
    for b, seq_len in enumerate(seq_lens):
        selected = selected_index[b].tolist()
        parents = parent_list.reshape(len(seq_lens), -1)[b].tolist()
        slots = {value: pos for pos, value in reversed(list(enumerate(selected[: n - 1])))}
        flat_positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = b * n + i
            parent = _parent_slot(i - 1, selected, parents, slots, topk)
            if parent == -1:
                continue
            parent_position = 0 if parent is None else parent + 1
            first_child = int(retrieve_next_token[b, parent_position])
            retrieve_next_token[b, parent_position] = i
            if first_child != -1:
                retrieve_next_sibling[b, i] = first_child
        retrieve_index[b, 0] = b * n

        for x in range(n):
            if tree_mask_mode == FULL_MASK:
                row = n * n * b + prefix * n + (seq_len + n) * x + seq_len
            else:
                row = n * n * b + n * x
            mask[row] = True
            mask[row + 1 : row + n] = False
            if x == 0:
                continue
            current, depth_of_x = x - 1, 0
            for _ in range(depth):
                depth_of_x += 1
                mask[row + 1 + current] = True
                parent = _parent_slot(current, selected, parents, slots, topk)
                if parent is None or parent == -1:
                    break
                current = parent
            flat_positions[b * n + x] = depth_of_x + seq_len
        prefix += seq_len


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy verification of each request's draft tree: from the root, descend to the child whose
    draft token equals the target's greedy token at the current node, as long as one does.

    Writes the accepted flat token ids (`accept_index[b, 0]` is the root), their count without the
    root (`accept_token_num`), and at every accepted node (and the last one) the target's token in
    `predicts`. Argument names keep the C++ schema's spelling.
    """
    num_draft = candidates.shape[1]
    num_speculative = accept_index.shape[1]
    targets = target_predict.reshape(-1)
    for b in range(candidates.shape[0]):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, node = 0, 0
        for _ in range(1, num_speculative):
            node = int(retrive_next_token[b, node])
            target = int(targets[last])
            for _ in range(num_draft):
                if node == -1:
                    break
                if int(candidates[b, node]) == target:
                    predicts[last] = target
                    accepted += 1
                    last = int(retrive_index[b, node])
                    accept_index[b, accepted] = last
                    break
                node = int(retrive_next_sibling[b, node])
            else:
                node = -1
            if node == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = targets[last]
