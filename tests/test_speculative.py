"""Speculative decoding in real rollout servers on the CPU, with the bundled model and drafter.

Lossless means: greedy outputs equal HF `generate` (and so SD off) for every strategy and batch
size, also when the adaptive policy switches speculation on and off mid-generation; sampled outputs
follow the policy's distribution (chi-square against probabilities computed with HF), a test that
the same server fails when its acceptance rule is biased; returned logprobs are the policy's.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import pytest
import requests
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM, AutoTokenizer

from tlt.local.process import RolloutServerProcess
from tlt.models.hf_generate import greedy_generate
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.tasks import GcdTask
from trainer.grpo import token_logprobs

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 200
DRAFTER = ["--draft-model-path", str(BUNDLED_DRAFTER), "--random-seed", "0"]
STRATEGIES = {
    "chain-3": ["--speculative", "always", "--draft-steps", "3", *DRAFTER],
    "tree-3x2": ["--speculative", "always", "--draft-steps", "3", "--draft-topk", "2", "--draft-tokens", "6", *DRAFTER],
    # EAGLE and history arms: the bandit tries each in every bucket, so sources switch mid-generation.
    "adaptive": ["--speculative", "adaptive", "--history-arms", "[2, 4, 8]", "--enable-metrics", *DRAFTER],
}
HISTORY_ONLY = ["--speculative", "adaptive", "--speculative-arms", "[]", "--history-arms", "[3]", *DRAFTER]


@cache
def _hf():
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    return model, tokenizer


@cache
def _greedy_reference() -> tuple[list[list[int]], list[list[int]]]:
    """32 held-out prompts and HF's greedy continuations of them."""
    model, tokenizer = _hf()
    prompts = [tokenizer(p.prompt).input_ids for p in GcdTask().sample(32, seed=3, split="test")]
    outputs = greedy_generate(model, prompts, MAX_NEW_TOKENS, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return prompts, [list(o) for o in outputs]


def _server(name: str, args: list[str], tmp_path_factory) -> RolloutServerProcess:
    return RolloutServerProcess(BUNDLED_MODEL, tmp_path_factory.mktemp(name) / "server.log", args=args)


@pytest.fixture(scope="module", params=list(STRATEGIES))
def sd_server(request, tmp_path_factory) -> Iterator[tuple[str, RolloutServerProcess]]:
    with _server(request.param, STRATEGIES[request.param], tmp_path_factory) as server:
        yield request.param, server


def _generate(server: RolloutServerProcess, prompts: list[list[int]], **params) -> list[dict]:
    payload = {"input_ids": prompts, "sampling_params": params, "return_logprob": params.pop("logprob", False)}
    response = requests.post(f"{server.url}/generate", json=payload, timeout=600)
    response.raise_for_status()
    return response.json()


@pytest.mark.parametrize("batch", [1, 5, 32])
def test_greedy_outputs_equal_hf_generate(sd_server, batch: int) -> None:
    name, server = sd_server
    prompts, reference = _greedy_reference()
    results = _generate(server, prompts[:batch], max_new_tokens=MAX_NEW_TOKENS, temperature=0)
    assert [r["output_ids"] for r in results] == reference[:batch]
    verified = [r["meta_info"]["spec_verify_ct"] for r in results]
    tokens = [len(r["output_ids"]) for r in results]
    assert all(v >= 1 for v in verified), "every request went through speculative verification"
    if name != "adaptive":  # a good drafter commits several tokens per verification
        assert sum(tokens) / sum(verified) > 1.5


def _metric_samples(server: RolloutServerProcess, metric: str) -> dict[tuple[str, str, str], float]:
    """(bucket, draft steps, source) -> value."""
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    pattern = re.compile(rf'^{metric}\{{bucket="(\d+)",draft_steps="(\d+)",source="(\w+)"\}} ([0-9.e+]+)$', re.MULTILINE)
    return {(b, s, source): float(v) for b, s, source, v in pattern.findall(text)}


def test_adaptive_policy_switches_speculation_on_and_off_within_one_generation(tmp_path_factory) -> None:
    prompts, reference = _greedy_reference()
    with _server("adaptive-switch", STRATEGIES["adaptive"], tmp_path_factory) as server:
        results = _generate(server, prompts, max_new_tokens=MAX_NEW_TOKENS, temperature=0)
        choices = _metric_samples(server, "tlt_sd_choices_total")
    assert [r["output_ids"] for r in results] == reference
    # One batch of 32 shrinking to its longest request: the bandit explores every arm in every
    # bucket it passes through, so speculation went off and on, and drafts switched between the
    # drafter and the history, while the long requests ran.
    arms_used = {(source, int(s)) for (_, s, source), n in choices.items() if n > 0}
    assert ("eagle", 0) in arms_used and arms_used & {("eagle", k) for k in (1, 2, 3, 4)}
    assert arms_used >= {("history", k) for k in (2, 4, 8)}
    assert len({b for (b, _, _), n in choices.items() if n > 0}) >= 3, "the batch crossed several buckets"
    # Steps at arm 0 are not counted as speculative: the tokens the speculative steps committed (one
    # per step plus its accepted drafts) fall short of all decoded tokens (all but the prefill's) by
    # the arm-0 steps (SGLang itself counts an arm-0 step as a verification: the sums would match).
    committed = sum(r["meta_info"].get("spec_verify_ct", 0) + r["meta_info"].get("spec_num_correct_drafts", 0) for r in results)
    decoded = sum(len(r["output_ids"]) - 1 for r in results)
    assert committed < decoded


def _policy_distribution(prompt: list[int], top_p: float) -> torch.Tensor:
    """P(t1, t2, t3 | prompt) of the policy at temperature 1 with SGLang's nucleus rule."""
    model, _ = _hf()
    vocab = model.config.vocab_size

    def next_probs(prefixes: list[list[int]]) -> torch.Tensor:
        with torch.no_grad():
            probs = model(torch.tensor(prefixes)).logits[:, -1].softmax(-1)
        ordered, order = probs.sort(dim=-1, descending=True)
        keep = (ordered.cumsum(-1) - ordered) <= top_p
        kept = probs * torch.zeros_like(keep).scatter(-1, order, keep)
        return kept / kept.sum(-1, keepdim=True)

    p1 = next_probs([prompt])[0]
    p2 = next_probs([prompt + [a] for a in range(vocab)])
    p3 = next_probs([prompt + [a, b] for a in range(vocab) for b in range(vocab)]).view(vocab, vocab, vocab)
    return p1[:, None, None] * p2[:, :, None] * p3


def _chi_square_pvalue(server: RolloutServerProcess, top_p: float, draws: int = 3000) -> float:
    """Chi-square of the first three sampled tokens against the policy; cells expected < 5 pooled."""
    _, tokenizer = _hf()
    prompt = tokenizer("84,36:").input_ids
    results = _generate(server, [prompt] * draws, max_new_tokens=3, temperature=1.0, top_p=top_p, ignore_eos=True)
    assert all(r["meta_info"]["spec_verify_ct"] >= 1 for r in results), "tokens 2-3 come from verification"
    assert sum(r["meta_info"]["spec_num_correct_drafts"] for r in results) > draws / 10, "drafts were accepted"
    counts = Counter(tuple(r["output_ids"][:3]) for r in results)
    joint = _policy_distribution(prompt, top_p)
    expected = joint * draws
    big = (expected >= 5).nonzero().tolist()
    observed = [counts.pop(tuple(cell), 0) for cell in big]
    expected_cells = [float(expected[tuple(cell)]) for cell in big]
    observed.append(sum(counts.values()))
    expected_cells.append(draws - sum(expected_cells))
    return float(chisquare(observed, expected_cells).pvalue)


@pytest.fixture(scope="module")
def chain_server(tmp_path_factory) -> Iterator[RolloutServerProcess]:
    with _server("chain-sampling", STRATEGIES["chain-3"], tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="module")
def history_server(tmp_path_factory) -> Iterator[RolloutServerProcess]:
    """History drafts only: the later draws of a batch draft from their finished siblings."""
    with _server("history-sampling", HISTORY_ONLY, tmp_path_factory) as server:
        yield server


@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.parametrize("source", ["eagle", "history"])
def test_sampling_keeps_the_policy_distribution(chain_server, history_server, source: str, top_p: float) -> None:
    assert _chi_square_pvalue(chain_server if source == "eagle" else history_server, top_p) > 1e-4


def test_the_distribution_test_fails_for_a_biased_acceptance_rule(tmp_path_factory) -> None:
    # SGLang's own knob: accept a draft when the coin is below mass / 0.3, not below the mass. One
    # acceptance rule verifies EAGLE's and the history's chains alike: the history's drafts test it.
    biased = [*HISTORY_ONLY, "--", "--speculative-accept-threshold-acc", "0.3"]
    with _server("biased-rule", biased, tmp_path_factory) as server:
        assert _chi_square_pvalue(server, 1.0) < 1e-6


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory) -> Iterator[RolloutServerProcess]:
    with _server("no-speculation", ["--random-seed", "0"], tmp_path_factory) as server:
        yield server


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("speculation", ["on", "off"])
def test_the_trainers_logprobs_of_sampled_tokens_are_the_servers(
    chain_server, plain_server, speculation: str, temperature: float
) -> None:
    """The importance ratio's two sides: what the server returns for the tokens it sampled, and
    what the trainer computes for them (`trainer.grpo.token_logprobs`, the distribution at T)."""
    server = chain_server if speculation == "on" else plain_server
    model, _ = _hf()
    prompts, _ = _greedy_reference()
    results = _generate(server, prompts[:4], max_new_tokens=60, temperature=temperature, logprob=True)
    for result, prompt in zip(results, prompts, strict=False):
        sequence = torch.tensor([prompt + result["output_ids"]])
        with torch.no_grad():
            trainer_side = token_logprobs(model(sequence).logits, sequence, temperature)[0, len(prompt) - 1 :]
        served = torch.tensor([entry[0] for entry in result["meta_info"]["output_token_logprobs"]])
        assert torch.allclose(served, trainer_side, atol=1e-4, rtol=0)
        if temperature != 1.0:  # and the raw logits' distribution is measurably another one
            with torch.no_grad():
                raw = token_logprobs(model(sequence).logits, sequence)[0, len(prompt) - 1 :]
            assert (served - raw).abs().max() > 1e-2


def test_the_drafter_catches_up_after_speculation_was_off(tmp_path_factory) -> None:
    """A long request decodes its first 200 tokens beside four others, in a batch above the
    speculative cap (arm 0, where the drafter does not run), then alone with 4-step chains. The
    drafter's KV cache is brought up to date in one extend when drafting resumes: acceptance is
    that of a drafter that ran every step (about 3.9 tokens per step measured; a drafter left
    stale, SGLang's SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND, accepts almost nothing), and the
    tokens equal those of the same request decoded alone."""
    prompts, _ = _greedy_reference()
    args = ["--speculative", "adaptive", "--speculative-arms", "[0, 4]", "--max-speculative-batch", "4", *DRAFTER]
    with _server("catch-up", args, tmp_path_factory) as server:
        alone = _generate(server, prompts[:1], max_new_tokens=400, temperature=0, ignore_eos=True)[0]
        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(_generate, server, prompts[:1], max_new_tokens=400, temperature=0, ignore_eos=True)
            time.sleep(0.05)  # the long request is running when the short ones join
            _generate(server, prompts[1:5], max_new_tokens=200, temperature=0, ignore_eos=True)
            mixed = beside.result()[0]
    assert mixed["output_ids"] == alone["output_ids"]
    meta = mixed["meta_info"]
    speculative_steps = meta.get("spec_verify_ct", 0)
    assert 20 <= speculative_steps < 100, "about half of the 400 tokens were decoded off"
    assert (speculative_steps + meta["spec_num_correct_drafts"]) / speculative_steps > 3.0
