"""Stand-in for the `sgl_kernel` package on machines where only its CUDA wheels exist.

`rollout_server` puts the folder above this one on PYTHONPATH only when SGLang runs on the CPU and
no real `sgl_kernel` is importable, so it never shadows the real kernels. It exposes the index,
EAGLE-tree and draft-metadata ops SGLang imports by name, written in PyTorch in `rollout_server.cpu`.
"""

from rollout_server.cpu.attention import build_draft_decode_metadata_cpu
from rollout_server.cpu.ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]
