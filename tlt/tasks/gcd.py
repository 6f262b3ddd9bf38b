"""Subtractive Euclid: find gcd(a, b) by repeatedly subtracting the smaller number from the larger.

A worked solution writes every intermediate pair, so its length is the sum of the partial
quotients of a/b: most problems take a handful of steps and a few take dozens (gcd(97, 2) takes
49), a heavy tail like that of real reasoning responses. The final answer is checkable.

    prompt    "84,36:"
    response  "48,36;12,36;12,24;12,12=12"
"""

from __future__ import annotations

import math
import random
import re
import zlib
from dataclasses import dataclass
from typing import Literal

Split = Literal["train", "test"]
_ANSWER = re.compile(r"=(\d+)$")


@dataclass(frozen=True)
class GcdProblem:
    """One problem; `a != b`, both positive."""

    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a},{self.b}:"

    @property
    def answer(self) -> int:
        return math.gcd(self.a, self.b)

    def steps(self) -> list[tuple[int, int]]:
        """The pairs after each subtraction, ending at (g, g)."""
        a, b, pairs = self.a, self.b, []
        while a != b:
            if a > b:
                a -= b
            else:
                b -= a
            pairs.append((a, b))
        return pairs

    def solution(self) -> str:
        """The worked solution the model is pretrained on (the response, without end token)."""
        return ";".join(f"{a},{b}" for a, b in self.steps()) + f"={self.answer}"

    def reward(self, response: str) -> float:
        """1.0 when the response ends with the right answer, else 0.0 (the trace is not graded)."""
        return 1.0 if parse_answer(response) == self.answer else 0.0


def parse_answer(response: str) -> int | None:
    """The number after the final `=`, or None when the response has no final answer."""
    match = _ANSWER.search(response.strip())
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class GcdTask:
    """The problem family: pairs of distinct numbers in [1, max_value], split by a fixed hash so
    that train and test problems never overlap."""

    max_value: int = 99
    test_fraction: float = 0.1

    ALPHABET = "0123456789,:;="

    def split_of(self, problem: GcdProblem) -> Split:
        bucket = zlib.crc32(f"{problem.a},{problem.b}".encode()) % 1000
        return "test" if bucket < self.test_fraction * 1000 else "train"

    def sample(self, n: int, seed: int, split: Split = "train") -> list[GcdProblem]:
        """`n` problems of one split, drawn uniformly (with repetition) by a seeded generator."""
        rng = random.Random(seed)
        out: list[GcdProblem] = []
        while len(out) < n:
            a, b = rng.randint(1, self.max_value), rng.randint(1, self.max_value)
            problem = GcdProblem(a, b)
            if a != b and self.split_of(problem) == split:
                out.append(problem)
        return out
