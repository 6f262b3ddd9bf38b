"""Continual drafter training (`tlt.drafter.continual`) on the bundled model's own samples: a
training preempted many times ends exactly where an uninterrupted one does and commits a better
drafter; data used up stops it until new samples come; the paired comparison, the split and
the workers' shares."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tlt.drafter.comparison import paired_gain
from tlt.drafter.continual import (
    ContinualConfig,
    ContinualTraining,
    FeatureCache,
    Sample,
    Verdict,
    is_held_out,
    sample_owner,
)
from tlt.drafter.model import EagleDrafter, PolicyParts
from tlt.drafter.training import DrafterTrainingConfig, PolicySequence, policy_features
from tlt.paths import BUNDLED_MODEL
from tlt.tasks import GcdTask


class Preempted(Exception):
    pass


@pytest.fixture(scope="module")
def policy_samples():
    policy = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL)
    torch.manual_seed(0)
    samples = []
    for n, problem in enumerate(GcdTask().sample(64, seed=3, split="train")):
        prompt = tokenizer(problem.prompt).input_ids
        out = policy.generate(torch.tensor([prompt]), max_new_tokens=160, do_sample=True, temperature=1.0, pad_token_id=0)
        samples.append(Sample(f"{1000 + n}-0", PolicySequence(out[0].tolist(), len(prompt))))
    features = {s.sample_id: policy_features(policy, s.sequence.token_ids) for s in samples}
    return policy, samples, features


def _training(policy, samples, features, **config) -> ContinualTraining:
    training = ContinualTraining(
        policy.config,
        ContinualConfig(**{"held_out": 16, "eval_steps": 6, "commit_z": 2.0, **config}),
        DrafterTrainingConfig(epochs=4, lr=3e-3, tokens_per_row=512, rows_per_step=1),
        torch.device("cpu"),
    )
    torch.manual_seed(1)
    training.rebase(1, EagleDrafter(policy.config).state_dict())  # a fresh drafter as version 1
    training.add_samples(samples)
    for sample in training.missing_features():
        training.features.put(sample.sample_id, features[sample.sample_id])
    return training


def _until_commit(training: ContinualTraining, parts: PolicyParts, check) -> tuple[Verdict | None, int]:
    preemptions = 0
    while True:
        try:
            if training.needs_round:
                assert training.start_round(parts)
            verdict = training.advance(check)
        except Preempted:
            preemptions += 1
            continue
        if verdict is None or verdict.commit:
            return verdict, preemptions


def test_a_training_preempted_many_times_ends_where_an_uninterrupted_one_does(policy_samples) -> None:
    policy, samples, features = policy_samples
    parts = PolicyParts(policy)
    straight = _training(policy, samples, features)
    verdict, _ = _until_commit(straight, parts, lambda: None)
    assert verdict is not None and verdict.commit
    print(f"committed after {verdict.steps} steps: {verdict.comparison}")
    assert verdict.comparison.candidate > verdict.comparison.base + 0.1

    calls = itertools.count(1)

    def flaky() -> None:  # a request every 7th unit of work
        if next(calls) % 7 == 0:
            raise Preempted

    interrupted = _training(policy, samples, features)
    again, preemptions = _until_commit(interrupted, parts, flaky)
    assert preemptions >= 3
    assert again == verdict
    for name, tensor in straight.state().items():
        torch.testing.assert_close(interrupted.state()[name], tensor, rtol=0, atol=0)


def test_used_up_data_stops_training_until_new_samples_arrive(policy_samples) -> None:
    policy, samples, features = policy_samples
    parts = PolicyParts(policy)
    training = _training(policy, samples[:40], features, commit_z=100.0, round_evals=100)
    assert training.start_round(parts)
    verdicts = []
    while (verdict := training.advance()) is not None:
        verdicts.append(verdict)
    assert verdicts and not any(v.commit for v in verdicts)  # z = 100: nothing is worth committing
    trainable = sum(1 for s in samples[:40] if not is_held_out(s.sample_id, 0.2))
    assert training.steps >= 4 * trainable // 8  # four passes of rows of several sequences
    assert not training.has_work
    steps = training.steps
    assert training.add_samples(samples[8:48]) == 8
    assert training.has_work and training.missing_features()
    for sample in training.missing_features():
        training.features.put(sample.sample_id, features[sample.sample_id])
    training.advance()
    assert training.steps > steps


def test_a_round_waits_for_enough_held_out_sequences_to_measure_its_error(policy_samples) -> None:
    policy, samples, features = policy_samples
    held = sum(1 for s in samples[:40] if is_held_out(s.sample_id, 0.2))
    assert not _training(policy, samples[:40], features, min_held_out=held + 1).start_round(PolicyParts(policy))
    assert _training(policy, samples[:40], features, min_held_out=held).start_round(PolicyParts(policy))
    with pytest.raises(ValueError, match="exceeds held_out"):
        ContinualConfig(held_out=8, min_held_out=9)


def test_a_new_window_is_trained_on_at_once(policy_samples) -> None:
    """The training window moves on (a new RL step's samples replace the old): the pass in progress
    is over, not a pass of samples that left the window."""
    policy, samples, features = policy_samples
    training = _training(policy, samples[:32], features, commit_z=100.0, round_evals=100, eval_steps=3)
    assert training.start_round(PolicyParts(policy))
    assert training.advance() is not None and training.steps == 3
    assert training.add_samples(samples[32:]) == 32
    for sample in training.missing_features():
        training.features.put(sample.sample_id, features[sample.sample_id])
    training.discard(samples[40].sample_id)
    for _ in range(2):  # left out for as long as it is in the window
        assert training.add_samples(samples[32:]) == 0 and samples[40].sample_id not in {s.sample_id for s in training.missing_features()}
    assert training.advance() is not None and training.steps == 6


def test_a_rebase_adds_the_uncommitted_change_onto_the_newer_version(policy_samples) -> None:
    """Two workers train from v1 on their own data; one commits v2; the other's change since v1
    lands on top of v2, so their work adds up."""
    policy, samples, features = policy_samples
    parts = PolicyParts(policy)
    first, second = _training(policy, samples[:32], features, eval_steps=2), _training(policy, samples[32:], features, eval_steps=2)
    v1 = first.state()
    for training in (first, second):
        assert training.start_round(parts)
        training.advance()
    v2 = first.state()
    first.committed(2)
    before = second.state()
    second.rebase(2, v2)
    assert second.base_version == 2 and second.needs_round
    for name in v1:
        torch.testing.assert_close(second.state()[name], v2[name] + before[name] - v1[name])
    assert any(not torch.equal(second.state()[n], v2[n]) for n in v1)


def test_the_paired_gain_and_its_clustered_error() -> None:
    comparison = paired_gain({"a": [1, 1], "b": [2, 2]}, {"a": [2, 2], "b": [2, 3]})
    assert comparison.gain == pytest.approx(0.75)
    assert comparison.standard_error == pytest.approx(0.25)  # residuals +-0.5 over 2 clusters, 4 positions
    # Three standard errors, but the error comes from 2 clusters: Student's t on 1 degree of
    # freedom, tan(pi (p - 1/2)) at the normal z's one-sided level p, not z itself.
    assert comparison.critical(2.0) == pytest.approx(math.tan(math.pi * (NormalDist().cdf(2.0) - 0.5)))
    assert comparison.critical(2.0) > 13 and not comparison.beats(2.0) and comparison.beats(0.5)
    assert not paired_gain({"a": [1, 1]}, {"a": [3, 3]}).beats(0.0)  # one sequence: no verdict
    # 5 sequences, 3 of them one token better: 2.45 standard errors, short of t's 2.87 on 4 degrees.
    few = paired_gain({str(n): [3, 3] for n in range(5)}, {str(n): [3, 3 + (n < 3)] for n in range(5)})
    assert few.gain == pytest.approx(0.3) and few.gain / few.standard_error == pytest.approx(math.sqrt(6))
    assert few.critical(2.0) == pytest.approx(2.87, abs=0.01) and not few.beats(2.0) and few.beats(1.5)
    many = paired_gain({str(n): [3] for n in range(400)}, {str(n): [3 + (n % 2)] for n in range(400)})
    assert 2.0 < many.critical(2.0) < 2.01 and many.beats(2.0)  # many clusters: t is nearly normal
    with pytest.raises(ValueError):
        paired_gain({"a": [1]}, {"b": [1]})


def test_the_split_follows_the_id_and_the_cache_its_bound() -> None:
    ids = [f"{t}-{s}" for t in range(1000, 3000) for s in range(2)]
    held = [i for i in ids if is_held_out(i, 0.2)]
    assert abs(len(held) / len(ids) - 0.2) < 0.03
    assert held == [i for i in ids if is_held_out(i, 0.2)]
    cache = FeatureCache(max_bytes=3 * 400)
    for n in range(5):
        cache.put(str(n), torch.zeros(100))  # 400 bytes each
    assert len(cache) == 3 and "0" not in cache and "4" in cache and cache.bytes == 1200
    cache.retain({"4"})
    assert len(cache) == 1 and cache.bytes == 400


def test_only_the_newest_held_out_samples_are_kept_so_no_others_features_are_computed() -> None:
    training = ContinualTraining(
        AutoConfig.from_pretrained(BUNDLED_MODEL), ContinualConfig(held_out=4, min_held_out=2), DrafterTrainingConfig(), torch.device("cpu")
    )
    window = [Sample(f"{1000 + n}-0", PolicySequence([5, 6, 7, 8], 2)) for n in range(200)]
    training.add_samples(window)
    held = [s.sample_id for s in window if is_held_out(s.sample_id, 0.2)]
    assert len(held) > 4
    trained = {s.sample_id for s in window} - set(held)
    assert {s.sample_id for s in training.missing_features()} == trained | set(held[-4:])
    # A worker's share filters the training samples only: every worker measures on the same held-out ones.
    training.add_samples(window, lambda sample_id: sample_id.endswith("7-0"))
    assert {s.sample_id for s in training.window} == {i for i in trained if i.endswith("7-0")} | set(held[-4:])


def test_workers_share_the_samples_evenly_and_a_leaving_worker_moves_only_its_own() -> None:
    ids = [f"{t}-{s}" for t in range(1000, 2500) for s in range(2)]
    workers = ["rollout-0", "rollout-1", "rollout-2"]  # names of one length, as a CRC would have split them all one way
    owners = {i: sample_owner(i, workers) for i in ids}
    for worker in workers:
        assert abs(list(owners.values()).count(worker) / len(ids) - 1 / 3) < 0.03
    assert owners == {i: sample_owner(i, list(reversed(workers))) for i in ids}  # the order of the board is no matter
    after = {i: sample_owner(i, workers[:2]) for i in ids}
    assert all(after[i] == owners[i] for i in ids if owners[i] != "rollout-2")
    assert {sample_owner(i, ["rollout-0"]) for i in ids} == {"rollout-0"}
    with pytest.raises(ValueError):
        sample_owner("1-0", [])
