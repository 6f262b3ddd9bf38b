"""The EAGLE drafter: SGLang layout, packing isolation, loss, training, offline acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.checkpoints import make_random_checkpoint
from tlt.drafter.acceptance import chain_accept_lengths, response_starts
from tlt.drafter.model import EagleDrafter, PolicyParts, export_sglang_checkpoint
from tlt.drafter.training import (
    DrafterTrainingConfig,
    PolicySequence,
    drafter_forward,
    eagle_loss,
    pack,
    policy_features,
    train_drafter,
)
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def policy(request, tmp_path_factory):
    path = make_random_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _sequences(count: int, seed: int = 0) -> list[PolicySequence]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        length = int(torch.randint(8, 30, (1,), generator=gen))
        ids = torch.randint(2, 16, (length,), generator=gen).tolist()
        out.append(PolicySequence(ids, prompt_len=int(torch.randint(2, 6, (1,), generator=gen))))
    return out


def test_export_has_sglang_eagle_names_and_config(policy, tmp_path: Path) -> None:
    drafter = EagleDrafter(policy.config)
    export_sglang_checkpoint(drafter, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [{"qwen2": "Qwen2ForCausalLMEagle", "llama": "LlamaForCausalLMEagle"}[policy.config.model_type]]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    names = set(load_file(tmp_path / "model.safetensors"))
    assert {"fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight"} <= names
    assert {"layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight"} <= names
    # Borrowed from the target by SGLang's EAGLE worker, and absent from EAGLE's first layer:
    assert not any(n.startswith(("embed_tokens", "lm_head", "layers.0.input_layernorm")) for n in names)
    assert load_file(tmp_path / "model.safetensors")["fc.weight"].shape == (policy.config.hidden_size, 2 * policy.config.hidden_size)


def test_packed_sequences_do_not_see_each_other(policy) -> None:
    parts, drafter = PolicyParts(policy), EagleDrafter(policy.config).eval()
    sequences = _sequences(3)
    features = [policy_features(policy, s.token_ids) for s in sequences]
    (packed,) = pack(sequences, features, tokens_per_row=1000)
    together = drafter_forward(drafter, parts, packed)[0]
    offset = 0
    for seq, feats in zip(sequences, features):
        (alone,) = pack([seq], [feats], tokens_per_row=1000)
        steps = len(seq.token_ids) - 1
        assert torch.allclose(together[offset : offset + steps], drafter_forward(drafter, parts, alone)[0], atol=1e-5)
        offset += steps
    assert packed.loss_mask.sum() == sum(len(s.token_ids) - max(s.prompt_len - 1, 1) for s in sequences)


def test_loss_is_zero_feature_error_and_entropy_for_a_perfect_prediction(policy) -> None:
    target = torch.randn(1, 5, policy.config.hidden_size)
    mask = torch.tensor([[True, True, False, True, True]])
    loss, metrics = eagle_loss(target.clone(), target, policy.get_output_embeddings(), mask, ce_weight=0.1)
    probs = policy.get_output_embeddings()(target[mask]).softmax(-1)
    entropy = -(probs * probs.log()).sum(-1).mean()
    assert metrics["feature_loss"] == 0.0 and metrics["top1"] == 1.0
    assert loss.item() == pytest.approx(0.1 * entropy.item(), rel=1e-5)


def test_training_lowers_the_loss(policy) -> None:
    sequences = _sequences(24, seed=1)
    batches = pack(sequences, [policy_features(policy, s.token_ids) for s in sequences], tokens_per_row=128)
    torch.manual_seed(0)
    history = train_drafter(EagleDrafter(policy.config), PolicyParts(policy), batches, DrafterTrainingConfig(epochs=15, rows_per_step=1))
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]


class _OracleDrafter(torch.nn.Module):
    """Returns the policy's true next feature at each position (read back from the rotary
    embedding it is given): along an accepted chain every greedy draft must then be accepted."""

    def __init__(self, policy, parts: PolicyParts, sequence: PolicySequence) -> None:
        super().__init__()
        hidden = policy.model(input_ids=torch.tensor([sequence.token_ids])).last_hidden_state[0]
        self.true_next = hidden[1:]  # at position t: f_{t+1}
        self.table = parts.position_embeddings(hidden[None], torch.arange(len(hidden))[None])[0][0]

    def forward(self, token_embeds, features, position_embeddings, attention_mask):
        positions = torch.cdist(position_embeddings[0][0], self.table).argmin(-1)
        return self.true_next[positions][None]


def _accept_lengths_one_start_at_a_time(drafter, parts, sequence, features, steps, starts) -> list[int]:
    """The definition: each start drafts alone on its own true prefix, then on its own drafts."""
    ids = torch.tensor(sequence.token_ids)
    lengths = []
    for p in starts:
        tokens, feats, accepted = ids[1 : p + 2].clone(), features[: p + 1].clone(), 0
        for i in range(steps):
            embeds = parts.embed_tokens(tokens)[None]
            mask = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()[None, None]
            positions = parts.position_embeddings(embeds, torch.arange(len(tokens))[None])
            predicted = drafter(embeds, feats[None], positions, mask)[0, -1]
            draft = int(parts.lm_head(predicted).argmax())
            if draft != int(ids[p + 2 + i]):
                break
            accepted += 1
            tokens, feats = torch.cat([tokens, torch.tensor([draft])]), torch.cat([feats, predicted[None]])
        lengths.append(accepted + 1)
    return lengths


def test_accept_length_is_full_for_an_oracle_and_bounded_for_a_random_drafter(policy) -> None:
    prompt = [5, 6, 13]
    out = policy.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    sequence = PolicySequence(out[0].tolist(), prompt_len=len(prompt))
    features = policy_features(policy, sequence.token_ids)
    starts = response_starts(sequence, steps=4)
    assert starts and all(p + 4 + 1 < len(sequence.token_ids) for p in starts)
    parts = PolicyParts(policy)
    oracle = chain_accept_lengths(_OracleDrafter(policy, parts, sequence), parts, sequence, features, 4, starts)
    assert oracle == [5] * len(starts)
    random_lengths = chain_accept_lengths(EagleDrafter(policy.config).eval(), parts, sequence, features, 4, starts)
    assert all(1 <= n <= 5 for n in random_lengths)


@torch.no_grad()
def test_drafting_all_starts_together_equals_drafting_each_alone() -> None:
    """The bundled drafter on the bundled policy's own greedy responses: long accepted chains,
    so every draft step of the packed layout is exercised."""
    policy = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    drafter = EagleDrafter(policy.config).eval()
    drafter.load_state_dict(load_file(BUNDLED_DRAFTER / "model.safetensors"))
    parts = PolicyParts(policy)
    lengths = []
    for prompt in ([3, 7, 9, 12, 4], [5, 6, 13], [8, 2, 11, 10]):
        out = policy.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False, eos_token_id=None, pad_token_id=0)
        sequence = PolicySequence(out[0].tolist(), prompt_len=len(prompt))
        features = policy_features(policy, sequence.token_ids)
        for steps, every in ((4, 1), (2, 3)):
            starts = response_starts(sequence, steps, every)
            together = chain_accept_lengths(drafter, parts, sequence, features, steps, starts)
            assert together == _accept_lengths_one_start_at_a_time(drafter, parts, sequence, features, steps, starts)
            lengths += together
    assert sum(lengths) / len(lengths) > 2.0 and max(lengths) == 5
    assert chain_accept_lengths(drafter, parts, sequence, features, 4, []) == []
