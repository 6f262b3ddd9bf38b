"""TLT's SGLang plugin (entry point `sglang.srt.plugins: tlt`), run by SGLang in each of its
processes before it serves.

On every device it rejects malformed prompts with HTTP 400 (`request_checks`) before they reach
the scheduler, and puts TLT's bandit (`adaptive_policy`) in charge of adaptive speculation. On the CPU engine it registers TLT's PyTorch versions of the `sgl_kernel` CPU ops as
`torch.ops.sgl_kernel.*` operators, so code that reaches them through `torch.ops` (rather than
`from sgl_kernel import ...`, which the stand-in package answers) finds them too, among them the
three attention ops of the `intel_amx` backend, which it then keeps SGLang from replacing on CPUs
without AMX. An operator that a real `sgl_kernel` build already defines is left alone.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import msgspec
import torch

from rollout_server import adaptive_policy, cpu
from rollout_server.adaptive_policy import BanditSpecPolicy
from rollout_server.cpu import attention, ops, sampling
from rollout_server.draft_catch_up import catch_up, stub_draft_extend
from rollout_server.drafter_swap import DRAFTER_JOB_ENV, swapper_for
from rollout_server.history_source import chain_outputs
from rollout_server.request_checks import check_prompt_ids
from rollout_server.sample_recorder import SAMPLES_JOB_ENV, recorder_from_env
from rollout_server.server_features import install_features_route

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
    "decode_attention_cpu": (attention.decode_attention_cpu, ("k_cache", "v_cache", "output")),
    "extend_attention_cpu": (attention.extend_attention_cpu, ("o_extend",)),
    "build_draft_decode_metadata_cpu": (attention.build_draft_decode_metadata_cpu, ()),
}

_ADAPTIVE_POLICY = "sglang.srt.speculative.eagle_worker_v2.AdaptiveSpeculativeParams"
_STREAM_OUTPUT = "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer.stream_output"
_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
_RESOLVE_SPEC_TOKENS = (
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor._resolve_spec_v2_tokens"
)
_VERIFY_USES_GREEDY = "sglang.srt.speculative.eagle_utils._verify_uses_greedy"
# Names SGLang's EAGLE verification resolves per platform; None on the CPU.
_SAMPLED_VERIFY_OPS = {
    "tree_speculative_sampling_target_only": sampling.tree_speculative_sampling_target_only_cpu,
    "top_k_renorm_prob": sampling.top_k_renorm_prob,
    "top_p_renorm_prob": sampling.top_p_renorm_prob,
}
_AMX_FALLBACK_PASS = "sglang.srt.arg_groups.overrides._attention_backend_platform_fallbacks"
_GET_LOADS = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.get_loads"
_WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
_DRAFT_WORKER = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker"


def _defined(name: str) -> bool:
    return hasattr(torch.ops.sgl_kernel, name)


# Kept alive for the process: the operators are registered as long as their Library exists.
_SGL_KERNEL_LIBRARY: list[torch.library.Library] = []


def register_cpu_ops() -> list[str]:
    """Define the missing `sgl_kernel::*_cpu` operators; returns the names defined now.

    Each is a schema (inferred from the function's annotations) with the Python function as its
    CPU kernel. Not `torch.library.custom_op`: its autograd, version-bump and aliasing layers cost
    about 8 us per call (measured: 10 us against 2 us), paid per layer and per forward pass on a
    path that never needs gradients.
    """
    defined = []
    for name, (fn, mutated) in CPU_OPS.items():
        if _defined(name):
            continue
        if not _SGL_KERNEL_LIBRARY:
            _SGL_KERNEL_LIBRARY.append(torch.library.Library("sgl_kernel", "FRAGMENT"))
        library = _SGL_KERNEL_LIBRARY[0]
        library.define(name + torch.library.infer_schema(fn, mutates_args=mutated))
        library.impl(name, fn, "CPU")
        defined.append(name)
    return defined


def _keep_intel_amx_on_cpu(original_fn, view) -> dict:
    """AROUND-hook on SGLang's platform-fallback pass, which swaps the `intel_amx` attention backend
    for `torch_native` on CPUs without AMX. With TLT's PyTorch ops that backend runs on any CPU, and
    it is SGLang's only CPU backend that can verify speculative drafts; every other fallback stays."""
    if view.attention_backend == "intel_amx" and view.device == "cpu":
        return {}
    return original_fn(view)


def install_sampled_verification() -> bool:
    """Give SGLang's EAGLE verification on the CPU the sampling ops it lacks; returns whether all
    of them are TLT's now (then the greedy fallback for sampled requests is lifted)."""
    from sglang.srt.speculative import eagle_utils

    for name, fn in _SAMPLED_VERIFY_OPS.items():
        # Direct assignment: HookRegistry cannot patch a None (it would rebind every None it finds).
        if getattr(eagle_utils, name) is None:
            setattr(eagle_utils, name, fn)
    return all(getattr(eagle_utils, name) is fn for name, fn in _SAMPLED_VERIFY_OPS.items())


def _sampled_verify_on_cpu(original_fn, **kwargs) -> bool:
    """AROUND-hook on `_verify_uses_greedy`: SGLang forces greedy verification on the CPU (no
    kernel), which would make sampled rollouts argmax ones; with TLT's ops the CPU samples."""
    return original_fn(**{**kwargs, "is_cpu": False})


# Created on first use, in the scheduler process: one drafter swapper per scheduler, one recorder.
_swapper_of = functools.cache(swapper_for)
_recorder = functools.cache(recorder_from_env)


def _swap_drafter_between_batches(scheduler, *args, **kwargs) -> None:
    """BEFORE-hook on Scheduler.run_batch: the one point where no forward pass is in flight."""
    swapper = _swapper_of(scheduler)
    if swapper is not None:
        swapper.apply_pending()


def _record_finished_samples(streamer, reqs, *args, **kwargs) -> None:
    """BEFORE-hook on SchedulerOutputStreamer.stream_output, which sees every finished request."""
    recorder = _recorder()
    if recorder is not None:
        recorder.record_finished(reqs)


def _keep_history(streamer, reqs, *args, **kwargs) -> None:
    """BEFORE-hook on SchedulerOutputStreamer.stream_output: finished responses become history."""
    policy = adaptive_policy.active_policy()
    if policy is not None and policy.history is not None:
        policy.history.observe_finished(reqs)


# The history chain of the draft being built: set around EagleDraftWorker.draft, read by its
# draft_forward (the scheduler runs one batch at a time on one thread).
_history_chain: list = []


def _missed_inputs(worker, batch):
    """The policy's record of drafter inputs missed at 0 draft steps, where it applies to this batch."""
    policy = adaptive_policy.active_policy()
    if policy is None or policy.missed is None or batch.forward_mode.is_idle():
        return None
    from sglang.srt.runtime_context import get_spec

    # Sampled drafts (rejection sampling) need the drafter's distribution, which the catch-up
    # does not rebuild; SGLang's own extend runs then.
    return None if get_spec().speculative_use_rejection_sampling else policy.missed


def _skip_drafter_when_off(original_fn, worker, batch, batch_result, *args, **kwargs):
    """AROUND-hook on EagleDraftWorker._draft_extend_for_decode: at 0 draft steps the drafter's
    inputs are kept for a catch-up instead of running it (`draft_catch_up`)."""
    missed = _missed_inputs(worker, batch)
    hidden = batch_result.logits_output.hidden_states
    size = len(batch.reqs)
    if missed is None or worker.speculative_num_steps != 0 or hidden is None or hidden.shape[0] != size:
        return original_fn(worker, batch, batch_result, *args, **kwargs)
    positions = (batch_result.new_seq_lens - 1).tolist()
    missed.keep([req.rid for req in batch.reqs], positions, hidden, batch_result.next_token_ids[:size].tolist())
    stub_draft_extend(worker, batch, batch_result.next_draft_input)
    return None


def _forget_missed_on_prefill(worker, batch, *args, **kwargs) -> None:
    """BEFORE-hook on EagleDraftWorker._draft_extend_for_prefill, which extends the drafter over a
    prefilled request's whole sequence: nothing is left to catch up on."""
    policy = adaptive_policy.active_policy()
    if policy is not None and policy.missed is not None and not batch.forward_mode.is_idle():
        policy.missed.forget([req.rid for req in batch.reqs])


def _draft_from_history(original_fn, worker, batch, *args, **kwargs):
    """AROUND-hook on EagleDraftWorker.draft. First the drafter catches up on the positions it
    missed at 0 draft steps; then, for a history arm, the chain comes from the token history
    (computed here, where the batch's requests are known) instead of the drafter."""
    missed = _missed_inputs(worker, batch)
    if missed is not None and len(missed):
        taken = missed.take([req.rid for req in batch.reqs], batch.seq_lens.tolist())
        if taken:
            started = time.perf_counter()
            catch_up(worker, batch, taken)
            adaptive_policy.active_policy().exclude_from_step(time.perf_counter() - started)
    policy = adaptive_policy.active_policy()
    arm = policy.launching_arm if policy is not None else None
    if arm is None or arm.source != "history" or policy.history is None or batch.forward_mode.is_idle():
        return original_fn(worker, batch, *args, **kwargs)
    if worker.speculative_num_steps != arm.draft_steps:
        raise RuntimeError(f"history arm of {arm.draft_steps} steps launched in a runtime state of {worker.speculative_num_steps}")
    from sglang.srt.runtime_context import get_spec

    if get_spec().speculative_use_rejection_sampling and not batch.sampling_info.is_all_greedy:
        raise RuntimeError("history drafts are point proposals: run without --speculative-use-rejection-sampling")
    # The drafter's own first guess (from its extend over the last step) fills positions the
    # history has no token for.
    filler = batch.spec_info.topk_index[:, 0]
    _history_chain.append(policy.history.drafts(batch.reqs, arm.draft_steps, filler))
    try:
        return original_fn(worker, batch, *args, **kwargs)
    finally:
        _history_chain.clear()


def _history_draft_forward(original_fn, worker, forward_batch, *args, **kwargs):
    """AROUND-hook on EagleDraftWorker.draft_forward: no drafter pass when the chain is history's."""
    if not _history_chain:
        return original_fn(worker, forward_batch, *args, **kwargs)
    return chain_outputs(_history_chain[0])


def _count_speculative_steps_only(original_fn, processor, result, batch, *args, **kwargs):
    """AROUND-hook on the result processor's `_resolve_spec_v2_tokens`, which counts every decode
    step of an EAGLE server as a verification (`spec_verify_ct`), arm 0 of the adaptive worker too.
    A step the bandit ran without drafts is not counted, so a request's `spec_verify_ct` is its
    number of speculative steps, and the tokens those steps committed are `spec_verify_ct` plus its
    accepted drafts (arm 0 accepts none)."""
    counts = [req.spec_verify_ct for req in batch.reqs]
    tokens = original_fn(processor, result, batch, *args, **kwargs)
    controller = getattr(processor.model_worker, "adaptive_controller", None)
    policy = getattr(controller, "params", None)
    arm = policy.reported_arm if isinstance(policy, BanditSpecPolicy) else None
    if arm is not None and not arm.speculative:
        for req, count in zip(batch.reqs, counts, strict=True):
            req.spec_verify_ct = count
    return tokens


def _count_requests_not_yet_scheduled(original_fn, manager, *args, **kwargs):
    """AROUND-hook on TokenizerManager.get_loads (`/v1/loads`): requests the tokenizer manager has
    accepted but the scheduler's load snapshot does not show yet count as waiting. Those are the
    requests of the last few hundred ms (measured: a batch of 64 showed in the snapshot 0.3-0.4 s
    after it was sent) and every request that arrives while generation is paused (a spot worker's
    memory hand-off holds them in the tokenizer manager): whoever watches the load to get out of
    the way (the spot worker) sees work at once."""

    async def loads():
        results = await original_fn(manager, *args, **kwargs)
        if results:
            accepted = len(manager.rid_to_state)
            known = sum(load.num_running_reqs + load.num_waiting_reqs for load in results)
            if accepted > known:
                first = results[0]
                results = [msgspec.structs.replace(first, num_waiting_reqs=first.num_waiting_reqs + accepted - known), *results[1:]]
        return results

    return loads()


def _idempotent_release(original_fn, updater, recv_req, *args, **kwargs):
    """AROUND-hook on the weight updater's release_memory_occupation: tags released already are
    skipped (SGLang would pause their memory twice). The spot worker's hand-off may repeat a release."""
    from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqOutput

    return _on_tags(original_fn, updater, recv_req, args, kwargs, released=False, nothing_to_do=ReleaseMemoryOccupationReqOutput)


def _idempotent_resume(original_fn, updater, recv_req, *args, **kwargs):
    """AROUND-hook on the weight updater's resume_memory_occupation: tags that are not released are
    skipped (SGLang would raise KeyError in its scheduler, which takes the server down). A spot
    worker recovering a hand-off cannot know whether its predecessor's release went through."""
    from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqOutput

    return _on_tags(original_fn, updater, recv_req, args, kwargs, released=True, nothing_to_do=ResumeMemoryOccupationReqOutput)


def _on_tags(original_fn, updater, recv_req, args, kwargs, *, released: bool, nothing_to_do):
    """SGLang's call for those of the request's tags (none: all of them, SGLang's way) whose memory
    is `released` now, or `nothing_to_do()` when there are none."""
    from sglang.srt.constants import GPU_MEMORY_ALL_TYPES

    tags = list(recv_req.tags) if recv_req.tags else list(GPU_MEMORY_ALL_TYPES)
    todo = [tag for tag in tags if (tag in updater.offload_tags) == released]
    if todo != tags:
        state = "not released" if released else "released already"
        logger.warning("TLT plugin: memory of %s is %s; skipped", sorted(set(tags) - set(todo)), state)
    if not todo:
        return nothing_to_do()
    return original_fn(updater, msgspec.structs.replace(recv_req, tags=todo), *args, **kwargs)


def _validate_prompt(manager, obj, input_ids, *args, **kwargs) -> None:
    """BEFORE-hook on TokenizerManager._validate_one_request, whose ValueErrors become HTTP 400."""
    check_prompt_ids(input_ids, manager.model_config.vocab_size)


def _in_http_process() -> bool:
    """Whether this is SGLang's HTTP server process (the launcher's), where its FastAPI app serves;
    the scheduler and detokenizer are multiprocessing children."""
    import multiprocessing

    return multiprocessing.parent_process() is None


def register() -> None:
    """Plugin entry point."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        _validate_prompt,
        HookType.BEFORE,
    )
    HookRegistry.register(_GET_LOADS, _count_requests_not_yet_scheduled, HookType.AROUND)
    if _in_http_process():
        install_features_route()
    HookRegistry.register(f"{_WEIGHT_UPDATER}.release_memory_occupation", _idempotent_release, HookType.AROUND)
    HookRegistry.register(f"{_WEIGHT_UPDATER}.resume_memory_occupation", _idempotent_resume, HookType.AROUND)
    # With --speculative-adaptive, SGLang's EAGLE worker asks this policy for each step's draft length.
    HookRegistry.register(_ADAPTIVE_POLICY, BanditSpecPolicy, HookType.REPLACE)
    HookRegistry.register(_RESOLVE_SPEC_TOKENS, _count_speculative_steps_only, HookType.AROUND)
    HookRegistry.register(f"{_DRAFT_WORKER}.draft", _draft_from_history, HookType.AROUND)
    HookRegistry.register(f"{_DRAFT_WORKER}.draft_forward", _history_draft_forward, HookType.AROUND)
    HookRegistry.register(f"{_DRAFT_WORKER}._draft_extend_for_decode", _skip_drafter_when_off, HookType.AROUND)
    HookRegistry.register(f"{_DRAFT_WORKER}._draft_extend_for_prefill", _forget_missed_on_prefill, HookType.BEFORE)
    HookRegistry.register(_STREAM_OUTPUT, _keep_history, HookType.BEFORE)
    if os.environ.get(DRAFTER_JOB_ENV):
        HookRegistry.register(_RUN_BATCH, _swap_drafter_between_batches, HookType.BEFORE)
    if os.environ.get(SAMPLES_JOB_ENV):
        HookRegistry.register(_STREAM_OUTPUT, _record_finished_samples, HookType.BEFORE)
    if cpu.cpu_engine_requested():
        HookRegistry.register(_AMX_FALLBACK_PASS, _keep_intel_amx_on_cpu, HookType.AROUND)
        if install_sampled_verification():
            HookRegistry.register(_VERIFY_USES_GREEDY, _sampled_verify_on_cpu, HookType.AROUND)
        defined = register_cpu_ops()
        logger.info("TLT plugin: CPU engine; PyTorch sgl_kernel ops registered: %s", ", ".join(defined) or "none")
