"""The character tokenizer as transformers 5 loads it next to a Qwen2 config (as SGLang does)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, Qwen2Config

from tlt.models.tokenizer import build_char_tokenizer, save_tokenizer
from tlt.tasks import GcdTask


def test_saved_tokenizer_agrees_with_its_definition(tmp_path: Path) -> None:
    ours = build_char_tokenizer(GcdTask.ALPHABET)
    Qwen2Config(vocab_size=len(ours)).save_pretrained(tmp_path)
    save_tokenizer(ours, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for problem in GcdTask().sample(200, seed=0):
        text = problem.prompt + problem.solution()
        ids = ours(text).input_ids
        assert loaded(text).input_ids == ids == [ours.convert_tokens_to_ids(ch) for ch in text]
        assert loaded.decode(ids) == text
    assert loaded.eos_token_id == ours.eos_token_id == 1
    assert loaded.pad_token_id == 0


@pytest.mark.parametrize("alphabet", ["ab a", "aa", "a\tb", "é"])
def test_alphabet_must_be_distinct_printable_ascii(alphabet: str) -> None:
    with pytest.raises(ValueError):
        build_char_tokenizer(alphabet)
