"""Request validation of a real rollout server process: bad requests get HTTP 400 and the
server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tlt.local.process import RolloutServerProcess
from tlt.rollout.client import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(random_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutServerProcess]:
    log = tmp_path_factory.mktemp("server-requests") / "server.log"
    with RolloutServerProcess(random_checkpoints["qwen2"], log) as running:
        yield running


@pytest.mark.parametrize(
    "payload",
    [
        {"input_ids": [3, 4], "sampling_params": {"temperature": -1}},
        {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": -5}},
        {"input_ids": [3, 10**6]},  # out of vocabulary: crashes plain SGLang 0.5.23
        {"input_ids": [3, -1]},
        {"text": "hello"},  # no character of it is in the vocabulary: an empty prompt
        {"sampling_params": {}},
    ],
    ids=["negative-temperature", "negative-max-tokens", "oov-id", "negative-id", "empty-prompt", "no-prompt"],
)
def test_malformed_request_gets_400_and_server_keeps_serving(server: RolloutServerProcess, payload) -> None:
    response = requests.post(f"{server.url}/generate", json=payload, timeout=60)
    assert response.status_code == 400, response.text
    assert server.alive()
    ok = server.client().generate([5, 6, 7], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert len(ok.output_ids) >= 1


def test_unparseable_json_gets_400(server: RolloutServerProcess) -> None:
    response = requests.post(
        f"{server.url}/generate", data="{not json", headers={"content-type": "application/json"}, timeout=60
    )
    assert response.status_code == 400
    assert server.client().healthy()
