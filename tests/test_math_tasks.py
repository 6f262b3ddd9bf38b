"""The final-answer checker and the JSONL task of real math datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tlt.jobs.spec import JobSpec
from tlt.tasks import JsonlTask, task_of
from tlt.tasks.math_answer import answers_match


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        ("so the total is \\boxed{42}.", "42", True),
        ("\\boxed{41} no wait, \\boxed{42}", "42", True),  # the last box counts
        ("The answer is 1,234.", "1234", True),
        ("x = 0.5", "1/2", True),
        ("\\boxed{\\frac{3}{4}}", "0.75", True),
        ("about 50%", "0.5", True),
        ("\\boxed{x^{2}+1}", "x^{2} + 1", True),
        ("we get 7 and then 8", "7", False),  # the last number counts
        ("\\boxed{42", "42", True),  # an unclosed box is no box: the last number counts
        ("no number here", "3", False),
        ("\\boxed{-3}", "3", False),
    ],
)
def test_final_answers(response: str, reference: str, expected: bool) -> None:
    assert answers_match(response, reference) is expected


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_jsonl_dataset_splits_stably_and_rewards_by_answer(tmp_path: Path) -> None:
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "source": "x"} for i in range(400)]
    task = JsonlTask(_write(tmp_path / "d.jsonl", rows))
    shuffled = JsonlTask(_write(tmp_path / "e.jsonl", rows[::-1]))
    assert {p.prompt for p in task.splits["test"]} == {p.prompt for p in shuffled.splits["test"]}
    assert 10 < len(task.splits["test"]) < 80 and not {p.prompt for p in task.splits["test"]} & {p.prompt for p in task.splits["train"]}
    drawn = task.sample(5, seed=3)
    assert drawn == task.sample(5, seed=3) and all(p in task.splits["train"] for p in drawn)
    problem = drawn[0]
    assert problem.reward(f"... \\boxed{{{problem.answer}}}") == 1.0 and problem.reward("\\boxed{-1}") == 0.0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{\"prompt\": \"a\", \"answer\": \"1\"}", "not json"], "line 2"),
        (["{\"prompt\": \"a\"}"], "line 1"),
        (["{\"prompt\": \"a\", \"answer\": \"1\"}"], "no test problems"),
    ],
)
def test_bad_datasets_are_refused_naming_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JsonlTask(_write(tmp_path / "bad.jsonl", lines))


def test_a_jsonl_job_needs_its_dataset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dataset_path is needed"):
        JobSpec(name="math", task="jsonl")
    job = tmp_path / "job.yaml"
    _write(tmp_path / "math.jsonl", [{"prompt": f"q{i}", "answer": "1"} for i in range(100)])
    job.write_text("name: math\ntask: jsonl\ndataset_path: math.jsonl\n")
    spec = JobSpec.from_yaml(job)
    assert spec.dataset_path == (tmp_path / "math.jsonl").resolve()
    assert isinstance(task_of(spec.task, spec.dataset_path), JsonlTask)
