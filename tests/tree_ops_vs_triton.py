"""Run SGLang's Triton EAGLE tree kernels (under TRITON_INTERPRET=1, on the CPU) and TLT's PyTorch
versions on the same random trees; exit 1 on the first difference. Used by tests/test_cpu_ops.py in
a subprocess, since the interpreter must be chosen before Triton is imported."""

from __future__ import annotations

import sys

import torch

from rollout_server.cpu import ops


def random_tree_inputs(gen: torch.Generator, batch: int, topk: int, depth: int, n: int):
    width = 1 + topk + (depth - 2) * topk if depth > 1 else 1  # parent_list entries per request
    pool = topk + (depth - 1) * topk * topk  # candidate scores the selection is taken from
    selected = torch.stack([torch.randperm(pool, generator=gen)[: n - 1].sort().values for _ in range(batch)])
    selected = torch.minimum(selected, torch.tensor(topk * width - 1))
    parents = torch.stack([torch.cat([torch.tensor([-1]), selected[b][torch.randint(0, n - 1, (width - 1,), generator=gen)]]) for b in range(batch)])
    seq_lens = torch.randint(3, 9, (batch,), generator=gen)
    return parents, selected, seq_lens


def build_both(parents, selected, seq_lens, topk, depth, n, mode):
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, sgl_build_tree_kernel_triton

    batch = len(seq_lens)
    size = int((seq_lens + n).sum()) * n if mode == ops.FULL_MASK else batch * n * n
    outs = []
    for impl in ("triton", "torch"):
        mask = torch.ones(size, dtype=torch.bool)
        positions = torch.full((batch * n,), -7, dtype=torch.long)
        index, next_token, next_sibling = torch.full((3, batch, n), -1, dtype=torch.long)
        args = (parents, selected, seq_lens, mask, positions, index, next_token, next_sibling, topk, depth, n)
        if impl == "triton":
            sgl_build_tree_kernel_triton(*args, TreeMaskMode(mode))
        else:
            ops.build_tree_kernel_efficient_cpu(*args, mode)
        outs.append((mask, positions, index, next_token, next_sibling))
    return outs


def verify_both(index, next_token, next_sibling, gen, batch, n, vocab=4):
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    candidates = torch.randint(0, vocab, (batch, n), generator=gen)
    target = torch.randint(0, vocab, (batch, n), generator=gen)
    outs = []
    for impl in ("triton", "torch"):
        predicts = torch.full((batch * n,), -1, dtype=torch.long)
        accept_index = torch.full((batch, n), -1, dtype=torch.long)
        accept_num = torch.zeros(batch, dtype=torch.long)
        args = (predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, target.view(-1))
        (verify_tree_greedy_triton if impl == "triton" else ops.verify_tree_greedy_cpu)(*args)
        outs.append((predicts, accept_index, accept_num))
    return outs


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    cases = 0
    for topk, depth, n in [(1, 4, 5), (2, 3, 6), (4, 4, 8), (3, 5, 10)]:
        for mode in (ops.FULL_MASK, ops.QLEN_ONLY):
            for _ in range(10):
                parents, selected, seq_lens = random_tree_inputs(gen, 3, topk, depth, n)
                triton_out, torch_out = build_both(parents, selected, seq_lens, topk, depth, n, mode)
                for name, a, b in zip(("mask", "positions", "index", "next_token", "next_sibling"), triton_out, torch_out):
                    if not torch.equal(a, b):
                        print(f"build_tree {name} differs: topk={topk} depth={depth} n={n} mode={mode}\n{a}\n{b}")
                        return 1
                _, _, index, next_token, next_sibling = torch_out
                for name, a, b in zip(("predicts", "accept_index", "accept_num"), *verify_both(index, next_token, next_sibling, gen, 3, n)):
                    if not torch.equal(a, b):
                        print(f"verify_tree_greedy {name} differs\n{a}\n{b}")
                        return 1
                cases += 1
    print(f"{cases} cases identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
