"""A real rollout server process (SGLang + TLT plugin on the CPU) against HF transformers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tlt.models.hf_generate import greedy_generate
from tlt.rollout.client import SamplingParams
from tlt.tasks import GcdTask

pytestmark = pytest.mark.slow


def _prompts(name: str, tokenizer, count: int) -> list[list[int]]:
    problems = GcdTask().sample(count, seed=7, split="test")
    return [tokenizer(p.prompt).input_ids for p in problems]


def _max_new_tokens(name: str) -> int:
    # The trained model's answers run to hundreds of tokens: let them finish.
    return 600 if name == "tiny-gcd" else 48


def _hf(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def test_greedy_output_equals_hf_generate(served_model) -> None:
    name, path, server = served_model
    model, tokenizer = _hf(path)
    prompts = _prompts(name, tokenizer, 8)
    expected = greedy_generate(
        model, prompts, _max_new_tokens(name), tokenizer.eos_token_id, tokenizer.pad_token_id, batch_size=1
    )
    params = SamplingParams(max_new_tokens=_max_new_tokens(name), temperature=0.0)
    client = server.client()
    got = [client.generate(p, params).output_ids for p in prompts]
    assert got == expected
    if name == "tiny-gcd":
        assert max(len(g) for g in got) > 40, "the trained model should write worked solutions"


def test_batched_and_concurrent_requests_equal_single_ones(served_model) -> None:
    name, path, server = served_model
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = _prompts(name, tokenizer, 24)
    params = SamplingParams(max_new_tokens=_max_new_tokens(name), temperature=0.0)
    client = server.client()
    single = [client.generate(p, params).output_ids for p in prompts]
    batched = [c.output_ids for c in client.generate_batch(prompts, params)]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        concurrent = list(pool.map(lambda p: client.generate(p, params).output_ids, prompts))
    assert batched == single
    assert concurrent == single


def test_logprobs_match_transformers_log_softmax(served_model) -> None:
    name, path, server = served_model
    model, tokenizer = _hf(path)
    client = server.client()
    params = SamplingParams(max_new_tokens=_max_new_tokens(name), temperature=1.0)
    for prompt in _prompts(name, tokenizer, 4):
        completion = client.generate(prompt, params, return_logprob=True)
        sequence = torch.tensor([prompt + completion.output_ids])
        with torch.no_grad():
            log_probs = model(sequence).logits[0].log_softmax(-1)
        positions = torch.arange(len(prompt) - 1, sequence.shape[1] - 1)
        reference = log_probs[positions, sequence[0, len(prompt) :]]
        assert completion.logprobs is not None
        assert torch.allclose(torch.tensor(completion.logprobs), reference, atol=1e-4, rtol=0)


def test_sglang_children_are_forked_from_the_launcher_on_the_cpu(served_model) -> None:
    """Forked, not spawned (each spawned child re-imports SGLang: seconds per server start)."""
    _, _, server = served_model
    (launcher,) = psutil.Process(server.process.pid).children()  # under tlt.local.guard
    children = launcher.children()
    assert len(children) >= 2, children  # the scheduler and the detokenizer
    for child in children:
        # A spawned child runs `python -c "from multiprocessing.spawn import spawn_main; ..."`.
        assert child.cmdline() == launcher.cmdline()
