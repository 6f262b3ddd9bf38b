"""Job files: YAML into the validated JobSpec; bad values and unknown fields are refused naming them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tlt.jobs.spec import JobSpec


def test_a_yaml_job_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: gcd-1\nsteps: 3\ngrpo:\n  kl_coef: 0.01\n  overlong: penalty\n")
    spec = JobSpec.from_yaml(path)
    assert spec.name == "gcd-1" and spec.steps == 3 and spec.samples_per_prompt == 8
    assert spec.grpo.kl_coef == 0.01 and spec.grpo.overlong == "penalty" and spec.grpo.clip_high == 0.28


@pytest.mark.parametrize(
    "text, field",
    [
        ("name: x\nsamples_per_prompt: 1\n", "samples_per_prompt"),
        ("name: 'bad name!'\n", "name"),
        ("name: x\ngrpo:\n  overlong: maybe\n", "grpo.overlong"),
        ("name: x\nlearning_rate: 1\n", "learning_rate"),
        ("- name: x\n", "JobSpec"),
    ],
)
def test_bad_job_files_are_refused_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError) as err:
        JobSpec.from_yaml(path)
    assert field in str(err.value)


def test_the_bundled_job_loads_with_paths_relative_to_its_file() -> None:
    from tlt.paths import BUNDLED_DRAFTER, BUNDLED_JOB, BUNDLED_MODEL

    spec = JobSpec.from_yaml(BUNDLED_JOB)
    assert spec.model_path == BUNDLED_MODEL.resolve() and spec.drafter_path == BUNDLED_DRAFTER.resolve()


def test_a_step_of_more_samples_than_the_limit_is_refused() -> None:
    with pytest.raises(ValidationError, match="prompts_per_step x samples_per_prompt"):
        JobSpec(name="huge", prompts_per_step=4096, samples_per_prompt=64)


def _yaml_documents() -> st.SearchStrategy[str]:
    """YAML mappings with job-like keys and values of any shape."""
    keys = st.sampled_from(["name", "steps", "grpo", "model_path", "temperature", "samples_per_prompt", "task", "dataset_path", "x"])
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
    values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
    return st.dictionaries(keys, values, max_size=6).map(yaml.safe_dump)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode), _yaml_documents().map(str.encode)))
def test_fuzzed_job_files_get_clear_errors_only(tmp_path_factory, content: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "job.yaml"
    path.write_bytes(content)
    try:
        JobSpec.from_yaml(path)
    except ValueError as err:  # pydantic's ValidationError is one
        assert str(err)
