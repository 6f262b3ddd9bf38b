"""A dataset of math problems as JSONL (one `{"prompt": ..., "answer": ...}` per line), rewarded by
the final-answer checker. Rows are split into train and test by a hash of the prompt, so the split is
stable whatever the file's order."""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tlt.tasks.gcd import Split
from tlt.tasks.math_answer import answers_match

MAX_ROWS = 10_000_000


class _Row(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: str = Field(min_length=1, max_length=100_000)
    answer: str = Field(min_length=1, max_length=1000)


@dataclass(frozen=True)
class MathProblem:
    prompt: str
    answer: str

    def reward(self, response: str) -> float:
        return 1.0 if answers_match(response, self.answer) else 0.0


class JsonlTask:
    """Problems from a JSONL file; `sample` draws like the GCD task does (seeded, with repetition)."""

    def __init__(self, path: Path, test_fraction: float = 0.1) -> None:
        self.path, self.test_fraction = path, test_fraction
        self.splits: dict[str, list[MathProblem]] = {"train": [], "test": []}
        with path.open() as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                if number > MAX_ROWS:
                    raise ValueError(f"{path}: more than {MAX_ROWS} rows")
                try:
                    row = _Row.model_validate(json.loads(line))
                except (json.JSONDecodeError, ValidationError) as err:
                    raise ValueError(f"{path}, line {number}: not a {{prompt, answer}} object ({err})") from None
                problem = MathProblem(row.prompt, row.answer)
                self.splits[self.split_of(problem)].append(problem)
        for split, problems in self.splits.items():
            if not problems:
                raise ValueError(f"{path}: no {split} problems (the split takes {test_fraction:.0%} of the prompts for test)")

    def split_of(self, problem: MathProblem) -> Split:
        return "test" if zlib.crc32(problem.prompt.encode()) % 1000 < self.test_fraction * 1000 else "train"

    def sample(self, n: int, seed: int, split: Split = "train") -> list[MathProblem]:
        return random.Random(seed).choices(self.splits[split], k=n)
