"""Character-level tokenizers in HF format (`tokenizer.json`), loadable by transformers and SGLang."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS = "<pad>", "<eos>"


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """One token per character of `alphabet`, plus <pad> (id 0) and <eos> (id 1); no BOS.

    transformers 5 loads the tokenizer of a Qwen2 checkpoint as `Qwen2Tokenizer`, which keeps our
    vocabulary but applies Qwen2's byte-level pre-tokenizer. The two agree on text made of printable
    ASCII without whitespace in which no two punctuation characters touch, so the alphabet has no
    whitespace and task formats keep punctuation apart (tests/test_tokenizer.py checks the agreement).
    """
    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet has repeated characters")
    if any(ch.isspace() or not ch.isprintable() or not ch.isascii() for ch in alphabet):
        raise ValueError("alphabet must be printable ASCII without whitespace")
    vocab = {PAD: 0, EOS: 1} | {ch: i + 2 for i, ch in enumerate(alphabet)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=PAD)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """Save in HF format (`tokenizer.json` + `tokenizer_config.json`)."""
    tokenizer.save_pretrained(directory)
