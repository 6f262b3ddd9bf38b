"""TLT's SGLang plugin (entry point `sglang.srt.plugins: tlt`), run by SGLang in each of its
processes before it serves.

On every device it rejects malformed prompts with HTTP 400 (`request_checks`) before they reach
the scheduler. On the CPU engine it registers TLT's PyTorch versions of the `sgl_kernel` CPU ops as
`torch.ops.sgl_kernel.*` operators, so code that reaches them through `torch.ops` (rather than
`from sgl_kernel import ...`, which the stand-in package answers) finds them too. An operator that
a real `sgl_kernel` build already defines is left alone.
"""

from __future__ import annotations

import logging

import torch

from rollout_server import cpu
from rollout_server.cpu import ops
from rollout_server.request_checks import check_prompt_ids

logger = logging.getLogger(__name__)

# Operator name -> (implementation, names of the arguments it writes into).
CPU_OPS: dict[str, tuple[object, tuple[str, ...]]] = {
    "assign_req_to_token_pool_cpu": (ops.assign_req_to_token_pool_cpu, ("req_to_token",)),
    "assign_extend_cache_locs_cpu": (ops.assign_extend_cache_locs_cpu, ("out_cache_loc",)),
    "assign_draft_cache_locs_contiguous_cpu": (ops.assign_draft_cache_locs_contiguous_cpu, ("out_cache_loc",)),
    "fill_bonus_tokens_cpu": (ops.fill_bonus_tokens_cpu, ("bonus_tokens",)),
    "fill_accept_out_cache_loc_cpu": (ops.fill_accept_out_cache_loc_cpu, ("accept_out_cache_loc",)),
    "copy_all_layer_kv_cache_cpu": (ops.copy_all_layer_kv_cache_cpu, ()),
    "rotate_input_ids_cpu": (ops.rotate_input_ids_cpu, ("input_ids",)),
}


def _defined(name: str) -> bool:
    return hasattr(torch.ops.sgl_kernel, name)


def register_cpu_ops() -> list[str]:
    """Define the missing `sgl_kernel::*_cpu` operators; returns the names defined now."""
    defined = []
    for name, (fn, mutated) in CPU_OPS.items():
        if _defined(name):
            continue
        torch.library.custom_op(f"sgl_kernel::{name}", mutates_args=mutated, device_types="cpu")(fn)
        defined.append(name)
    return defined


def _validate_prompt(manager, obj, input_ids, *args, **kwargs) -> None:
    """BEFORE-hook on TokenizerManager._validate_one_request, whose ValueErrors become HTTP 400."""
    check_prompt_ids(input_ids, manager.model_config.vocab_size)


def register() -> None:
    """Plugin entry point."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        _validate_prompt,
        HookType.BEFORE,
    )
    if cpu.cpu_engine_requested():
        defined = register_cpu_ops()
        logger.info("TLT plugin: CPU engine; PyTorch sgl_kernel ops registered: %s", ", ".join(defined) or "none")
