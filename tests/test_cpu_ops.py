"""Each PyTorch stand-in for an sgl_kernel CPU op against a plain element-by-element reference."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rollout_server.cpu import ops


def _requests(gen: torch.Generator, batch: int, pool_len: int, rows: int):
    """Distinct request rows and a [start, end) segment of each."""
    req_pool_indices = torch.randperm(rows, generator=gen)[:batch]
    starts = torch.randint(0, pool_len // 2, (batch,), generator=gen)
    lens = torch.randint(0, pool_len // 2, (batch,), generator=gen)
    return req_pool_indices, starts, starts + lens


@pytest.mark.parametrize("seed", range(5))
def test_assign_req_to_token_pool_matches_reference(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, pool_len, rows = 6, 40, 10
    req_pool_indices, start, end = _requests(gen, batch, pool_len, rows)
    out_cache_loc = torch.randint(1, 10_000, (int((end - start).sum()),), generator=gen)
    req_to_token = torch.randint(0, 5, (rows, pool_len), generator=gen, dtype=torch.int32)
    expected = req_to_token.clone()
    k = 0
    for i in range(batch):
        for j in range(int(start[i]), int(end[i])):
            expected[int(req_pool_indices[i]), j] = int(out_cache_loc[k])
            k += 1
    ops.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end, out_cache_loc, pool_len)
    assert torch.equal(req_to_token, expected)


@pytest.mark.parametrize("seed", range(5))
def test_assign_extend_cache_locs_is_the_inverse_gather(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, pool_len, rows = 5, 32, 8
    req_pool_indices, start, end = _requests(gen, batch, pool_len, rows)
    req_to_token = torch.randint(0, 10_000, (rows, pool_len), generator=gen, dtype=torch.int32)
    out = torch.full((int((end - start).sum()) + 3,), -7, dtype=torch.int64)
    expected = out.clone()
    k = 0
    for i in range(batch):
        for j in range(int(start[i]), int(end[i])):
            expected[k] = int(req_to_token[int(req_pool_indices[i]), j])
            k += 1
    ops.assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start, end, out, pool_len)
    assert torch.equal(out, expected)


def test_assign_draft_cache_locs_contiguous_matches_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, pool_len, topk, steps = 6, 50, 2, 3
    req_pool_indices = torch.tensor([4, 1, 3])
    seq_lens = torch.tensor([0, 10, 44])
    req_to_token = torch.randint(0, 10_000, (rows, pool_len), generator=gen, dtype=torch.int32)
    out = torch.zeros(3 * topk * steps, dtype=torch.int64)
    expected = [
        int(req_to_token[int(r), int(s) + j]) for r, s in zip(req_pool_indices, seq_lens) for j in range(topk * steps)
    ]
    ops.assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out, pool_len, topk, steps)
    assert out.tolist() == expected


def test_fill_bonus_tokens_takes_the_last_accepted_token() -> None:
    accept_tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    accept_lens = torch.tensor([1, 4, 2])
    bonus = torch.zeros(3, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, accept_tokens.shape[1])
    assert bonus.tolist() == [accept_tokens[i, int(accept_lens[i]) - 1].item() for i in range(3)]


def test_fill_accept_out_cache_loc_compacts_accepted_slots_in_order() -> None:
    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1], [6, 7, 8]])
    out_cache_loc = torch.arange(100, 109)
    dest = torch.full((9,), -1, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dest)
    expected = [int(out_cache_loc[i]) for i in accept_index.reshape(-1).tolist() if i != -1]
    assert dest[: len(expected)].tolist() == expected
    assert (dest[len(expected) :] == -1).all()


@pytest.mark.parametrize("with_select", [False, True])
def test_rotate_input_ids_matches_reference(with_select: bool) -> None:
    input_ids = torch.arange(20, 32)
    starts, lens = torch.tensor([0, 5, 9]), torch.tensor([5, 4, 0])
    topk_index = torch.tensor([[101], [102], [103]])
    select = torch.tensor([2, 6, 11]) if with_select else None
    expected = input_ids.tolist()
    for i in range(3):
        s, n = int(starts[i]), int(lens[i])
        if n == 0:
            continue
        segment = expected[s : s + n]
        expected[s : s + n - 1] = segment[1:]
        expected[int(select[i]) if select is not None else s + n - 1] = int(topk_index[i, 0])
    ops.rotate_input_ids_cpu(input_ids, starts, lens, topk_index, select)
    assert input_ids.tolist() == expected


def test_copy_all_layer_kv_cache_copies_rows_in_every_buffer() -> None:
    gen = torch.Generator().manual_seed(0)
    buffers = [torch.randn(16, 2, 4, generator=gen), torch.randn(16, 2, 4, generator=gen).half()]
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    # A chain of moves: 3 is read (as 3's old value) before 3 is overwritten.
    src, tgt = torch.tensor([3, 5, 9]), torch.tensor([7, 3, 1])
    expected = [b.clone() for b in buffers]
    for e, b in zip(expected, buffers):
        for s, t in zip(src.tolist(), tgt.tolist()):
            e[t] = b[s]
    ops.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for e, b in zip(expected, buffers):
        assert torch.equal(e, b)


@pytest.mark.slow
def test_eagle_tree_ops_match_sglangs_triton_kernels() -> None:
    """build_tree / verify_tree_greedy against SGLang's own Triton kernels, run by Triton's
    interpreter on the CPU (in a subprocess: the interpreter is chosen when Triton is imported)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("SGLANG_USE_CPU_ENGINE", None)  # import SGLang's kernels, not the CPU stand-ins
    result = subprocess.run(
        [sys.executable, "-m", "tests.tree_ops_vs_triton"], capture_output=True, text=True, env=env,
        check=False, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "80 cases identical" in result.stdout


def test_build_tree_on_a_chain() -> None:
    """topk 1, 3 drafts in a chain: each token sees the root and its ancestors; positions count up."""
    n = 4
    parents = torch.tensor([[-1, 0, 1]])  # parent_list entries: the selected index of each level's parent
    selected = torch.tensor([[0, 1, 2]])
    mask = torch.ones(n * n, dtype=torch.bool)
    positions = torch.zeros(n, dtype=torch.long)
    index, next_token, next_sibling = torch.full((3, 1, n), -1, dtype=torch.long)
    ops.build_tree_kernel_efficient_cpu(
        parents, selected, torch.tensor([5]), mask, positions, index, next_token, next_sibling, 1, 3, n, ops.QLEN_ONLY
    )
    assert mask.view(n, n).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert positions.tolist() == [5, 6, 7, 8]
    assert next_token.tolist() == [[1, 2, 3, -1]] and (next_sibling == -1).all()


@pytest.mark.parametrize(("topk", "depth", "n"), [(1, 4, 5), (2, 3, 6), (4, 4, 8)])
@pytest.mark.parametrize("mode", [ops.FULL_MASK, ops.QLEN_ONLY])
def test_a_batch_of_one_tree_shape_is_built_as_request_by_request(topk: int, depth: int, n: int, mode: int) -> None:
    """The shared-shape path (chains always take it) against the per-request builder."""
    from tests.tree_ops_vs_triton import random_tree_inputs

    gen = torch.Generator().manual_seed(topk)
    parents, selected, _ = random_tree_inputs(gen, 1, topk, depth, n)
    batch = 4
    parents, selected = parents.repeat(batch, 1), selected.repeat(batch, 1)
    seq_lens = torch.tensor([3, 9, 1, 6])
    cells = n * n * batch if mode == ops.QLEN_ONLY else int((seq_lens * n + n * n).sum())
    outputs = []
    for build in (ops.build_tree_kernel_efficient_cpu, ops._build_trees):
        mask = torch.ones(cells, dtype=torch.bool)
        positions = torch.zeros(batch * n, dtype=torch.long)
        index, next_token, next_sibling = torch.full((3, batch, n), -1, dtype=torch.long)
        build(parents, selected, seq_lens, mask, positions, index, next_token, next_sibling, topk, depth, n, mode)
        outputs.append((mask, positions, index, next_token, next_sibling))
    for shared, per_request in zip(*outputs):
        assert torch.equal(shared, per_request)


def _random_chains(gen: torch.Generator, batch: int, n: int, vocab: int):
    """Chain verify inputs whose drafts often match: tokens from a small vocabulary."""
    candidates = torch.randint(0, vocab, (batch, n), generator=gen)
    index = torch.arange(batch * n).view(batch, n)
    next_token = torch.arange(1, n + 1).masked_fill(torch.arange(n) == n - 1, -1).repeat(batch, 1)
    return candidates, index, next_token, torch.full((batch, n), -1)


@pytest.mark.parametrize("seed", range(4))
def test_batched_chain_verification_equals_the_per_request_walk(seed: int) -> None:
    """Greedy and sampled verification of chains (the batched path) against the tree walk."""
    from rollout_server.cpu import sampling

    gen = torch.Generator().manual_seed(seed)
    batch, n, vocab = 32, 5, 3
    candidates, index, next_token, next_sibling = _random_chains(gen, batch, n, vocab)
    target_predict = torch.randint(0, vocab, (batch * n,), generator=gen)
    probs = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 2, dim=-1)
    probs[0, 0, :] = torch.tensor([0.0, 1.0, 0.0])  # a zero-probability draft is never accepted
    coins, final = torch.rand(batch, n, generator=gen), torch.rand(batch, generator=gen)
    assert ops.is_chain(next_token, next_sibling)
    for width in (n, 3):  # the whole chain, and fewer tokens than the chain may commit
        runs = []
        for greedy, sampled in ((ops.verify_tree_greedy_cpu, sampling.tree_speculative_sampling_target_only_cpu),
                                (ops._verify_trees_greedy, sampling._verify_trees)):  # fmt: skip
            out = [torch.full((batch * n,), -5, dtype=torch.int32), torch.full((batch, width), -1, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)]
            greedy(*out, candidates, index, next_token, next_sibling, target_predict)
            sampled_out = [torch.full((batch * n,), -5, dtype=torch.int32), torch.full((batch, width), -1, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)]
            args = (candidates, index, next_token, next_sibling, coins, final, probs)
            if sampled is sampling._verify_trees:
                sampled(*sampled_out, *args, 1.0, 1.0)
            else:
                sampled(*sampled_out, *args, torch.zeros_like(probs))
            runs.append(out + sampled_out)
        for batched, walked in zip(*runs):
            assert torch.equal(batched, walked)
        assert 0 < int(runs[0][2].sum()) < batch * (width - 1)  # some accepted, some rejected
