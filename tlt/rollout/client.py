"""A small client for a rollout server's SGLang HTTP API."""

from __future__ import annotations

from typing import Any

import requests
from pydantic import BaseModel, Field


class SamplingParams(BaseModel):
    """The sampling parameters TLT sends with every rollout request."""

    max_new_tokens: int = Field(512, ge=1, le=32768)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    ignore_eos: bool = False


class Completion(BaseModel):
    """One finished generation."""

    output_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[float] | None = None
    spec_verify_ct: int = Field(0, description="speculative steps (with drafts) this request took part in; steps the adaptive bandit ran at 0 draft steps are not counted")
    spec_accepted_drafts: int = Field(0, description="draft tokens the policy accepted in them")
    weight_version: str | None = Field(None, description="the policy version that generated it (SGLang's weight_version)")


class RolloutClient:
    """Talks to one rollout server (`base_url`, e.g. http://127.0.0.1:30000)."""

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = requests.Session()

    def healthy(self) -> bool:
        """Whether the server answers /health with 200."""
        try:
            return self._session.get(f"{self.base_url}/health", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def generate(
        self, input_ids: list[int], params: SamplingParams, return_logprob: bool = False
    ) -> Completion:
        """Generate one continuation of a token-id prompt."""
        return parse_completion(self._post_generate(input_ids, params, return_logprob))

    def generate_batch(
        self, input_ids: list[list[int]], params: SamplingParams, return_logprob: bool = False
    ) -> list[Completion]:
        """Generate continuations of several prompts in one request (SGLang batches them)."""
        return [parse_completion(item) for item in self._post_generate(input_ids, params, return_logprob)]

    def _post_generate(self, input_ids: list[int] | list[list[int]], params: SamplingParams, return_logprob: bool):
        payload: dict[str, Any] = {
            "input_ids": input_ids,
            "sampling_params": params.model_dump(),
            "return_logprob": return_logprob,
        }
        response = self._session.post(f"{self.base_url}/generate", json=payload, timeout=self.timeout_s)
        response.raise_for_status()
        return response.json()


def parse_completion(item: dict[str, Any]) -> Completion:
    """A `Completion` from one element of SGLang's /generate answer."""
    meta = item.get("meta_info", {})
    finish = meta.get("finish_reason") or {}
    logprobs = meta.get("output_token_logprobs")
    return Completion(
        output_ids=item["output_ids"],
        text=item.get("text", ""),
        finish_reason=finish.get("type"),
        logprobs=[entry[0] for entry in logprobs] if logprobs else None,
        spec_verify_ct=meta.get("spec_verify_ct") or 0,
        spec_accepted_drafts=meta.get("spec_num_correct_drafts") or 0,
        weight_version=meta.get("weight_version"),
    )


def server_load(base_url: str, timeout_s: float = 5.0) -> int:
    """How many requests the server holds, running or waiting, over its data-parallel ranks
    (SGLang's `/v1/loads`; the plugin adds those its tokenizer manager holds). Raises
    requests.RequestException when the server does not answer."""
    answer = requests.get(f"{base_url}/v1/loads", params={"include": "core"}, timeout=timeout_s)
    answer.raise_for_status()
    return sum(load.get("num_running_reqs", 0) + load.get("num_waiting_reqs", 0) for load in answer.json().get("loads", []))


def model_info(base_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """SGLang's `/model_info`: the checkpoint the server serves (`model_path`, moved by weight
    updates) and its `weight_version`."""
    answer = requests.get(f"{base_url}/model_info", timeout=timeout_s)
    answer.raise_for_status()
    return answer.json()


def load_weights_from_disk(base_url: str, model_path: str, weight_version: str, timeout_s: float = 600.0) -> str | None:
    """Have the server load an HF checkpoint tagged `weight_version`: None when it did, else its
    answer (why not). Raises requests.RequestException when the server cannot be reached."""
    body = {"model_path": model_path, "weight_version": weight_version}
    answer = requests.post(f"{base_url}/update_weights_from_disk", json=body, timeout=timeout_s)
    if answer.status_code == 200 and answer.json().get("success", False):
        return None
    return answer.text[:500]
