"""The PyTorch versions of the intel_amx attention ops against a per-sequence, per-head reference."""

from __future__ import annotations

import pytest
import torch

from rollout_server.cpu import attention

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
POOL_ROWS, POOL_LEN, SLOTS = 12, 64, 2048


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float, cap: float):
    """q [Q, H, D], k/v [K, Hkv, D], visible [Q, K] -> [Q, H, D], one head and query at a time."""
    out = torch.empty(q.shape[0], HEADS, HEAD_DIM)
    group = HEADS // KV_HEADS
    for i in range(q.shape[0]):
        for h in range(HEADS):
            scores = (k[:, h // group] @ q[i, h]) * scale
            if cap > 0:
                scores = cap * torch.tanh(scores / cap)
            scores[~visible[i]] = float("-inf")
            out[i, h] = torch.softmax(scores, dim=0) @ v[:, h // group]
    return out


def _pool(gen: torch.Generator, batch: int):
    """A KV cache and a `req_to_token` table whose rows point at distinct random slots."""
    k_cache = torch.randn(SLOTS, KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn(SLOTS, KV_HEADS, HEAD_DIM, generator=gen)
    req_to_token = torch.randperm(SLOTS, generator=gen)[: POOL_ROWS * POOL_LEN].view(POOL_ROWS, POOL_LEN).int()
    req_pool_indices = torch.randperm(POOL_ROWS, generator=gen)[:batch]
    return k_cache, v_cache, req_to_token, req_pool_indices


@pytest.mark.parametrize(("seed", "batch", "cap"), [(0, 1, 0.0), (1, 5, 0.0), (2, 7, 30.0), (3, 3, 0.0)])
def test_decode_attention_writes_the_new_kv_and_attends_over_the_sequence(seed: int, batch: int, cap: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, req_to_token, pools = _pool(gen, batch)
    seq_lens = torch.randint(1, POOL_LEN, (batch,), generator=gen)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen)
    new_k = torch.randn(batch, KV_HEADS, HEAD_DIM, generator=gen)
    new_v = torch.randn(batch, KV_HEADS, HEAD_DIM, generator=gen)
    loc = req_to_token[pools, seq_lens - 1].long()
    out = torch.full((batch, HEADS, HEAD_DIM), float("nan"))
    k_before = k_cache.clone()

    attention.decode_attention_cpu(
        q, k_cache, v_cache, 1.0, 1.0, out, new_k, new_v, loc, torch.empty(0), req_to_token, pools, seq_lens,
        0.35, cap, False, 0, None, None,
    )  # fmt: skip

    assert torch.equal(k_cache[loc], new_k)
    untouched = torch.ones(SLOTS, dtype=torch.bool)
    untouched[loc] = False
    assert torch.equal(k_cache[untouched], k_before[untouched])
    for b in range(batch):
        slots = req_to_token[pools[b], : seq_lens[b]].long()
        visible = torch.ones(1, len(slots), dtype=torch.bool)
        expected = _reference(q[b : b + 1], k_cache[slots], v_cache[slots], visible, 0.35, cap)
        torch.testing.assert_close(out[b], expected[0], rtol=1e-5, atol=1e-5)


def _extend_case(gen: torch.Generator, batch: int, extend_lens: list[int]):
    k_cache, v_cache, req_to_token, pools = _pool(gen, batch)
    extend = torch.tensor(extend_lens)
    prefix = torch.randint(0, POOL_LEN - max(extend_lens), (batch,), generator=gen)
    starts = torch.cumsum(extend, 0) - extend
    tokens = int(extend.sum())
    q = torch.randn(tokens, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=gen)
    for b in range(batch):  # the backend writes the new KV to the cache before the op runs
        slots = req_to_token[pools[b], prefix[b] : prefix[b] + extend[b]].long()
        k_cache[slots] = k[starts[b] : starts[b] + extend[b]]
        v_cache[slots] = v[starts[b] : starts[b] + extend[b]]
    return k_cache, v_cache, req_to_token, pools, prefix, extend, starts, q, k, v


def _run_extend(case, tree_mask=None, is_causal=True, with_new_kv=True, cap=0.0) -> torch.Tensor:
    k_cache, v_cache, req_to_token, pools, prefix, extend, starts, q, k, v = case
    out = torch.full_like(q, float("nan"))
    attention.extend_attention_cpu(
        q, k if with_new_kv else None, v if with_new_kv else None, out, k_cache, v_cache, 1.0, 1.0,
        req_to_token, pools, prefix + extend, extend.int(), starts.int(), int(extend.max()), 0.35, cap,
        False, 0, None, None, tree_mask, is_causal,
    )  # fmt: skip
    return out


def _expected_extend(case, among_new: list[torch.Tensor], cap=0.0) -> torch.Tensor:
    k_cache, v_cache, req_to_token, pools, prefix, extend, starts, q, _, _ = case
    out = torch.empty_like(q)
    for b in range(len(pools)):
        slots = req_to_token[pools[b], : prefix[b] + extend[b]].long()
        visible = torch.cat([torch.ones(int(extend[b]), int(prefix[b]), dtype=torch.bool), among_new[b]], dim=1)
        rows = slice(int(starts[b]), int(starts[b] + extend[b]))
        out[rows] = _reference(q[rows], k_cache[slots], v_cache[slots], visible, 0.35, cap)
    return out


@pytest.mark.parametrize(("seed", "extend_lens", "cap"), [(0, [5], 0.0), (1, [3, 1, 9, 4], 0.0), (2, [2, 6], 20.0)])
def test_extend_attention_is_causal_over_prefix_and_new_tokens(seed: int, extend_lens: list[int], cap: float) -> None:
    case = _extend_case(torch.Generator().manual_seed(seed), len(extend_lens), extend_lens)
    causal = [torch.ones(n, n, dtype=torch.bool).tril() for n in extend_lens]
    expected = _expected_extend(case, causal, cap)
    torch.testing.assert_close(_run_extend(case, cap=cap), expected, rtol=1e-5, atol=1e-5)
    # Layers that share another layer's KV pass no new keys; the cache holds the same ones.
    torch.testing.assert_close(_run_extend(case, with_new_kv=False, cap=cap), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cap", [0.0, 20.0])
def test_one_new_token_per_sequence_sees_its_prefix_and_itself(cap: float) -> None:
    """The one-token path (verify at 0 draft steps, drafter extend) against the reference, with a
    1-node tree mask too; a sequence with an empty prefix attends to itself only."""
    case = _extend_case(torch.Generator().manual_seed(6), 5, [1] * 5)
    k_cache, v_cache, req_to_token, pools, prefix, _, _, _, k, v = case
    prefix[0] = 0  # the first sequence's new token is its first
    slot = req_to_token[pools[0], 0].long()
    k_cache[slot], v_cache[slot] = k[0], v[0]
    expected = _expected_extend(case, [torch.ones(1, 1, dtype=torch.bool)] * 5, cap)
    torch.testing.assert_close(_run_extend(case, cap=cap), expected, rtol=1e-5, atol=1e-5)
    one_node_trees = torch.ones(5, dtype=torch.bool)
    torch.testing.assert_close(_run_extend(case, tree_mask=one_node_trees, cap=cap), expected, rtol=1e-5, atol=1e-5)


def test_extend_attention_without_causality_sees_all_new_tokens() -> None:
    case = _extend_case(torch.Generator().manual_seed(4), 3, [4, 2, 5])
    full = [torch.ones(n, n, dtype=torch.bool) for n in (4, 2, 5)]
    torch.testing.assert_close(_run_extend(case, is_causal=False), _expected_extend(case, full), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_extend_attention_follows_the_tree_mask_of_verification(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, n = 4, 6
    case = _extend_case(gen, batch, [n] * batch)
    # Random trees: token i's parent is an earlier token; it sees itself and its ancestors.
    masks = []
    for _ in range(batch):
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            parent = int(torch.randint(0, i, (1,), generator=gen))
            mask[i] |= mask[parent]
        masks.append(mask)
    flat = torch.stack(masks).view(-1)
    torch.testing.assert_close(_run_extend(case, tree_mask=flat), _expected_extend(case, masks), rtol=1e-5, atol=1e-5)
    causal = _run_extend(case)
    assert not torch.allclose(causal, _expected_extend(case, masks)), "the tree mask must matter in this case"


def test_extend_attention_splits_large_batches_without_changing_results(monkeypatch: pytest.MonkeyPatch) -> None:
    case = _extend_case(torch.Generator().manual_seed(5), 6, [3, 7, 1, 4, 6, 2])
    whole = _run_extend(case)
    monkeypatch.setattr(attention, "_EXTEND_SCORE_BUDGET", 200)
    assert len(attention._extend_chunks([10] * 6, [3, 7, 1, 4, 6, 2], HEADS)) > 1
    torch.testing.assert_close(_run_extend(case), whole, rtol=1e-5, atol=1e-6)


def test_unsupported_attention_variants_fail_loudly() -> None:
    case = _extend_case(torch.Generator().manual_seed(6), 1, [2])
    k_cache, v_cache, req_to_token, pools, prefix, extend, starts, q, k, v = case
    args = [q, k, v, torch.empty_like(q), k_cache, v_cache, 1.0, 1.0, req_to_token, pools, prefix + extend,
            extend.int(), starts.int(), 2, 0.35, 0.0, False, 0, None, None, None, True]  # fmt: skip
    with pytest.raises(NotImplementedError, match="sliding-window"):
        attention.extend_attention_cpu(*args[:17], 4096, *args[18:])
    with pytest.raises(NotImplementedError, match="fp8"):
        attention.extend_attention_cpu(*args[:6], 0.5, *args[7:])


@pytest.mark.parametrize(("topk", "num_steps"), [(1, 4), (2, 3), (4, 2)])
def test_build_draft_decode_metadata_lays_out_each_candidates_chain(topk: int, num_steps: int) -> None:
    gen = torch.Generator().manual_seed(topk)
    batch = 3
    req_to_token = torch.randperm(POOL_ROWS * POOL_LEN, generator=gen).view(POOL_ROWS, POOL_LEN).int()
    pools = torch.randperm(POOL_ROWS, generator=gen)[:batch]
    seq_lens = torch.tensor([5, 17, 30])
    out = attention.build_draft_decode_metadata_cpu(req_to_token, pools, seq_lens, topk, num_steps, POOL_LEN)
    assert out.shape == (batch * topk, POOL_LEN) and out.dtype == torch.int32
    for b in range(batch):
        row, length = req_to_token[pools[b]], int(seq_lens[b])
        for t in range(topk):
            draft_start = length + t * num_steps
            expected = torch.cat([row[:length], row[draft_start : draft_start + num_steps]])
            assert torch.equal(out[b * topk + t, : length + num_steps], expected)
