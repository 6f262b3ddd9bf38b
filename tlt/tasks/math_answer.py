"""Checking a final math answer: the last `\\boxed{...}` of a response (else its last number) against
the reference, equal as numbers when both read as numbers (integers, decimals, fractions, thousands
separators, a trailing %), else equal as text after dropping spaces, `$` and a trailing period."""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?%?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """The contents of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unclosed


def final_answer(response: str) -> str | None:
    """What the response answers: its last boxed expression, else its last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


def as_number(text: str) -> Fraction | None:
    cleaned = text.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")
    cleaned = re.sub(r"^\\frac\{(-?\d+)\}\{(\d+)\}$", r"\1/\2", cleaned)
    percent = cleaned.endswith("%")
    try:
        value = Fraction(cleaned.removesuffix("%"))
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def _normalized(text: str) -> str:
    return re.sub(r"\s+|\$", "", text).rstrip(".").lower()


def answers_match(response: str, reference: str) -> bool:
    """Whether the response's final answer is the reference."""
    answer = final_answer(response)
    if answer is None:
        return False
    ours, theirs = as_number(answer), as_number(reference)
    if ours is not None and theirs is not None:
        return ours == theirs
    return _normalized(answer) == _normalized(reference)
