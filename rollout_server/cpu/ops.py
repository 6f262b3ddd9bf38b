"""Pure-PyTorch versions of the `sgl_kernel` CPU index and EAGLE-tree ops that SGLang's CPU path
calls.

SGLang's CPU engine imports these from `sgl_kernel`, whose PyPI wheels hold only CUDA code. Each
function keeps the argument order and in-place contract of the C++ op it stands in for (see the
Triton twin of each in `sglang/kernels/ops/...`), so SGLang calls them unchanged.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch


def _segment_cells(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(row, column) of every cell of the requests' [start, end) segments, in packed order (request
    by request), and their count: the index of a whole batch's segment copy in two tensors."""
    lengths = (end_offset.long() - start_offset.long()).clamp(min=0)
    total = int(lengths.sum())
    owner = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    packed_start = torch.cumsum(lengths, 0) - lengths
    columns = start_offset.long()[owner] + torch.arange(total, device=lengths.device) - packed_start[owner]
    return req_pool_indices.long()[owner], columns, total


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
    rows, columns, total = _segment_cells(req_pool_indices, start_offset, end_offset)
    req_to_token[rows, columns] = out_cache_loc[:total].to(req_to_token.dtype)


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
    rows, columns, total = _segment_cells(req_pool_indices, start_offset, end_offset)
    out_cache_loc[:total] = req_to_token[rows, columns].to(out_cache_loc.dtype)


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
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long().numpy(), src_loc.long().numpy()
    rows_needed = int(max(tgt.max(), src.max())) + 1
    for base, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        # A byte view of the buffer's first rows; fancy indexing reads every source row before the
        # assignment writes.
        view = np.frombuffer((ctypes.c_uint8 * (rows_needed * row_bytes)).from_address(base), dtype=np.uint8)
        view = view.reshape(rows_needed, row_bytes)
        view[tgt] = view[src]


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each request's extend segment of `input_ids` left by one and write its new token
    (`topk_index[i]`) at the segment's last position, or at `select_index[i]` when given."""
    lengths = extend_seq_lens.long().clamp(min=0)
    shifted = (lengths - 1).clamp(min=0)  # positions that take their successor's token
    owner = torch.repeat_interleave(torch.arange(lengths.numel()), shifted)
    first = torch.cumsum(shifted, 0) - shifted
    positions = extend_start_loc.long()[owner] + torch.arange(int(shifted.sum())) - first[owner]
    input_ids[positions] = input_ids[positions + 1]  # the read is a copy: no overlap hazard
    present = lengths > 0
    last = select_index.long() if select_index is not None else extend_start_loc.long() + lengths - 1
    input_ids[last[present]] = topk_index.reshape(-1)[present].to(input_ids.dtype)


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
    batch = verified_seq_len.numel()
    parents = parent_list.reshape(batch, -1)
    if batch > 1 and bool((selected_index == selected_index[:1]).all()) and bool((parents == parents[:1]).all()):
        # Every request has the same tree (always so for chains, topk 1): build it once, then
        # place it per request.
        _broadcast_tree(
            parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
            retrieve_next_token, retrieve_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
        )  # fmt: skip
        return
    _build_trees(
        parent_list, selected_index, verified_seq_len, tree_mask, positions, retrieve_index,
        retrieve_next_token, retrieve_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
    )  # fmt: skip


def _broadcast_tree(
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
    n: int,
    tree_mask_mode: int,
) -> None:
    """`build_tree_kernel_efficient_cpu` for a batch whose requests share one tree shape: request
    0's tree (built at length 0, QLEN_ONLY) written into every request's place."""
    batch = verified_seq_len.numel()
    mask0 = torch.zeros(n * n, dtype=torch.bool)
    positions0 = torch.zeros(n, dtype=positions.dtype)
    index0, next_token0, next_sibling0 = (torch.full((1, n), -1, dtype=t.dtype) for t in (retrieve_index, retrieve_next_token, retrieve_next_sibling))
    _build_trees(
        parent_list.reshape(batch, -1)[:1], selected_index[:1], torch.zeros(1, dtype=verified_seq_len.dtype), mask0,
        positions0, index0, next_token0, next_sibling0, topk, depth, n, QLEN_ONLY,
    )  # fmt: skip
    lens = verified_seq_len.long()
    retrieve_index[:batch] = (torch.arange(batch)[:, None] * n + torch.arange(n)[None, :]).to(retrieve_index.dtype)
    retrieve_next_token[:batch] = next_token0
    retrieve_next_sibling[:batch] = next_sibling0
    positions.view(-1)[: batch * n] = (lens[:, None] + positions0[None, :].long()).reshape(-1).to(positions.dtype)
    mask = tree_mask.view(-1)
    cells = torch.arange(n)
    if tree_mask_mode == QLEN_ONLY:
        starts = torch.arange(batch)[:, None] * n * n + cells[None, :] * n  # [B, n]: row x of request b
    else:
        prefix = torch.cumsum(lens, 0) - lens
        starts = (torch.arange(batch) * n * n + prefix * n + lens)[:, None] + (lens[:, None] + n) * cells[None, :]
    index = starts[:, :, None] + cells[None, None, :]
    mask[index.reshape(-1)] = mask0.view(1, n, n).expand(batch, n, n).reshape(-1)


def _build_trees(
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
    """`build_tree_kernel_efficient_cpu`, request by request."""
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
    if is_chain(retrive_next_token, retrive_next_sibling):
        # Node i's only child is i + 1: accept the leading drafts that equal the target's token.
        target_at = targets[retrive_index.long()]  # [B, N]: the target's token after node i
        matches = (candidates[:, 1:] == target_at[:, :-1])[:, : num_speculative - 1]
        accepted = matches.long().cumprod(dim=1).sum(dim=1)
        write_chain_acceptance(accept_index, accept_token_num, retrive_index, accepted)
        kept = torch.arange(num_draft)[None, :] <= accepted[:, None]
        flat = retrive_index.long()[kept]
        predicts[flat] = targets[flat].to(predicts.dtype)
        return
    _verify_trees_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling, targets)


def _verify_trees_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    targets: torch.Tensor,
) -> None:
    """Greedy verification on any tree, request by request (`targets` flat)."""
    num_draft = candidates.shape[1]
    num_speculative = accept_index.shape[1]
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


def is_chain(next_token: torch.Tensor, next_sibling: torch.Tensor) -> bool:
    """Whether every request's draft tree is the chain 0 -> 1 -> ... -> N-1 (topk 1)."""
    n = next_token.shape[1]
    chain = torch.arange(1, n + 1).masked_fill(torch.arange(n) == n - 1, -1)
    return bool((next_token == chain).all()) and bool((next_sibling == -1).all())


def write_chain_acceptance(
    accept_index: torch.Tensor, accept_token_num: torch.Tensor, retrive_index: torch.Tensor, accepted: torch.Tensor
) -> None:
    """A chain verification's outputs: the flat ids of nodes 0..accepted[b] at the front of
    `accept_index[b]` (the rest left as the caller filled it) and the accepted counts."""
    width = min(accept_index.shape[1], retrive_index.shape[1])
    kept = torch.arange(width)[None, :] <= accepted[:, None]
    front = accept_index[:, :width]
    front[kept] = retrive_index[:, :width].to(accept_index.dtype)[kept]
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
