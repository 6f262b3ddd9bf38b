"""EAGLE-1 draft head built from the policy's own transformers decoder layer.

    feature_{t+1} ~ layer( fc([ embed(token_{t+1}) ; feature_t ]) )

`feature_t` is the policy's last hidden state (after its final norm) at position t. The draft has
one decoder layer of the policy's architecture without its input norm (as in EAGLE and SGLang's
`*ForCausalLMEagle`), no final norm, and borrows the policy's token embedding, rotary embedding
and LM head, which stay frozen. Parameter names follow SGLang's EAGLE checkpoints (`fc.*`,
`layers.0.*`), so `export_sglang_checkpoint` writes a draft SGLang loads.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, PretrainedConfig, PreTrainedModel

from tlt.models.hf_checkpoint import tensor_files

EAGLE_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLMEagle", "llama": "LlamaForCausalLMEagle"}


def decoder_layer_class(config: PretrainedConfig) -> type[nn.Module]:
    """The transformers decoder-layer class of `config`'s architecture."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    module = sys.modules[model_class.__module__]
    return getattr(module, model_class._no_split_modules[0])


def draft_config(policy_config: PretrainedConfig) -> PretrainedConfig:
    """The policy's config reduced to one layer; untied (the draft borrows embedding and head, and
    SGLang's EAGLE worker crashes on a tied draft config)."""
    config = copy.deepcopy(policy_config)
    config.num_hidden_layers = 1
    config.tie_word_embeddings = False
    config._attn_implementation = "sdpa"
    if hasattr(config, "layer_types") and config.layer_types is not None:
        config.layer_types = config.layer_types[:1]
    return config


class EagleDrafter(nn.Module):
    """The trainable part of the drafter: `fc` and one decoder layer."""

    def __init__(self, policy_config: PretrainedConfig) -> None:
        super().__init__()
        if policy_config.model_type not in EAGLE_ARCHITECTURES:
            raise ValueError(f"no EAGLE layout for model type {policy_config.model_type!r}")
        self.config = draft_config(policy_config)
        hidden = self.config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        layer = decoder_layer_class(self.config)(self.config, layer_idx=0)
        layer.input_layernorm = nn.Identity()  # EAGLE's first layer reads fc's output directly
        self.layers = nn.ModuleList([layer])

    def forward(
        self,
        token_embeds: torch.Tensor,
        features: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Predicted next features, shape (batch, seq, hidden).

        token_embeds, features: (batch, seq, hidden); attention_mask: boolean (batch, 1, seq, seq),
        True where a position may attend.
        """
        hidden = self.fc(torch.cat([token_embeds, features], dim=-1))
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=attention_mask, position_embeddings=position_embeddings)
        return hidden


def rotary_class(config: PretrainedConfig) -> type[nn.Module]:
    """The transformers rotary-embedding class of `config`'s architecture."""
    module = sys.modules[MODEL_FOR_CAUSAL_LM_MAPPING[type(config)].__module__]
    (name,) = [n for n in vars(module) if n.endswith("RotaryEmbedding") and not n.startswith("_")]
    return getattr(module, name)


def read_tensors(checkpoint: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """These tensors of an HF safetensors checkpoint (single file or sharded), nothing else."""
    files = tensor_files(checkpoint)
    found: dict[str, torch.Tensor] = {}
    for name in names:
        if name not in files:
            raise KeyError(f"{checkpoint}: no tensor {name}")
        with safe_open(checkpoint / files[name], framework="pt") as shard:
            found[name] = shard.get_tensor(name)
    return found


class PolicyParts:
    """The frozen pieces of the policy the drafter borrows: embedding, rotary embedding, LM head."""

    def __init__(self, policy: PreTrainedModel) -> None:
        self.embed_tokens = policy.get_input_embeddings()
        self.lm_head = policy.get_output_embeddings()
        self.rotary_emb = policy.model.rotary_emb
        for module in (self.embed_tokens, self.lm_head):
            module.requires_grad_(False)

    @classmethod
    def from_checkpoint(cls, path: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> PolicyParts:
        """Only the borrowed parts of an HF checkpoint (read tensor by tensor, never the whole
        policy: a 7B policy is ~30 GB in float32, its embedding and head ~2 GB in bf16), in
        `dtype` on `device`."""
        config = AutoConfig.from_pretrained(path)
        embed_key, head_key = "model.embed_tokens.weight", "lm_head.weight"
        tied = bool(getattr(config, "tie_word_embeddings", False))
        tensors = read_tensors(Path(path), [embed_key] if tied else [embed_key, head_key])
        embed = tensors[embed_key].to(device=device, dtype=dtype)
        head = embed if tied else tensors[head_key].to(device=device, dtype=dtype)
        parts = cls.__new__(cls)
        parts.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        parts.lm_head = nn.Linear(head.shape[1], head.shape[0], bias=False, device=device, dtype=dtype).requires_grad_(False)
        parts.lm_head.weight = nn.Parameter(head, requires_grad=False)
        parts.rotary_emb = rotary_class(config)(config=config).to(device)
        return parts

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def position_embeddings(self, like: torch.Tensor, position_ids: torch.Tensor):
        return self.rotary_emb(like, position_ids)


def export_fresh_drafter(policy_path: Path, out: Path) -> None:
    """An untrained drafter for the policy, as an SGLang checkpoint: the same one wherever it is
    made (seeded), so a rollout server's first drafter is the drafter service's version 1."""
    from transformers import AutoConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        drafter = EagleDrafter(AutoConfig.from_pretrained(policy_path))
    export_sglang_checkpoint(drafter, out)


def export_sglang_checkpoint(drafter: EagleDrafter, out: Path) -> None:
    """Write `config.json` + `model.safetensors` in SGLang's EAGLE draft layout (no embedding or
    head: SGLang's EAGLE worker shares the target's)."""
    out.mkdir(parents=True, exist_ok=True)
    config = drafter.config.to_dict()
    config["architectures"] = [EAGLE_ARCHITECTURES[drafter.config.model_type]]
    config["tie_word_embeddings"] = False
    config.pop("_attn_implementation_autoset", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    tensors = {name: tensor.detach().contiguous() for name, tensor in drafter.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
