"""The distributed policy channel: the trainer (rank 0) and every rollout server join one
torch.distributed group, and each policy version is broadcast to all of them at once in buckets,
with SGLang's own weight-update API (`/init_weights_update_group`, `/begin_weight_update`,
`/update_weights_from_distributed` with `load_format: flattened_bucket`, `/end_weight_update`).
NCCL between GPUs; gloo on the CPU (what the tests run). Nothing touches a disk or Redis.

The group lasts while the set of servers does; a server that joins (scaled up, restarted) gets a
group of its own for its admission (the version barrier loads it alone), and the next publish
rebuilds the group over all of them. A server that fails mid-broadcast fails that publish for
every member (a collective has no partial success); the barrier then admits servers one by one.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import requests
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, _new_process_group_helper, _world
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trainer.policy_publisher import PublishFailed

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 * 2**20


def _buckets(weights: dict[str, torch.Tensor], limit: int) -> list[list[str]]:
    """Tensor names in order, cut into runs of at most `limit` bytes (a bigger tensor goes alone)."""
    buckets, current, size = [], [], 0
    for name, tensor in weights.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            buckets.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    return [*buckets, current] if current else buckets


class BroadcastPolicyPublisher:
    """Publishes policy versions by broadcasting them to the servers (see the module docstring).
    `address`: where the servers reach this process (a pod IP on a cluster)."""

    def __init__(
        self,
        address: str = "127.0.0.1",
        backend: str = "gloo",
        dtype: torch.dtype = torch.float32,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = 600.0,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, not {backend!r}")
        self.address, self.backend, self.dtype = address, backend, dtype
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self._weights: dict[str, torch.Tensor] = {}
        self._version: int | None = None
        self._group = None
        self._group_name = ""
        self._members: tuple[str, ...] = ()

    def write(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int, weights: dict[str, torch.Tensor] | None = None
    ) -> str:
        """Keep the weights of `version` in the servers' dtype (`weights`: the full weights of a
        sharded model) until `load_into` broadcasts them; returns the version's name."""
        state = model.state_dict() if weights is None else weights
        tied = getattr(model.config, "tie_word_embeddings", False)
        # A tied head is the embedding: SGLang's loaders skip it, so it is not sent.
        self._weights = {
            name: tensor.detach().to("cpu", self.dtype).contiguous()
            for name, tensor in state.items()
            if not (tied and name == "lm_head.weight")
        }
        self._version = version
        return f"broadcast:v{version}"

    def load_into(self, servers: Sequence[str], location: str, version: int) -> None:
        """Broadcast the kept version to `servers`; PublishFailed names them when it did not land."""
        if not servers:
            return
        if version != self._version or location != f"broadcast:v{version}":
            raise PublishFailed(f"policy v{version} is not the version this trainer holds (v{self._version})")
        try:
            if tuple(servers) != self._members:
                self._join(tuple(servers))
            self._broadcast(version)
        except (PublishFailed, RuntimeError, requests.RequestException) as err:
            self.close()
            raise PublishFailed(f"policy v{version} not broadcast to {list(servers)}: {err}") from err

    def close(self) -> None:
        """Leave the current group (the servers' side of it is replaced at the next join)."""
        if self._group is not None:
            for url in self._members:
                try:
                    requests.post(f"{url}/destroy_weights_update_group", json={"group_name": self._group_name}, timeout=30)
                except requests.RequestException:
                    pass  # gone: its group went with it
            dist.destroy_process_group(self._group)
        self._group, self._members = None, ()

    def _join(self, servers: tuple[str, ...]) -> None:
        self.close()
        ranks = [int(requests.get(f"{url}/server_info", timeout=30).json().get("tp_size", 1)) for url in servers]
        offsets = [1 + sum(ranks[:i]) for i in range(len(servers))]
        world = 1 + sum(ranks)
        name = f"tlt-policy-{uuid.uuid4().hex[:12]}"
        port = _free_port(self.address)
        timeout = timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(self.address, port, world, is_master=True, timeout=timeout, wait_for_workers=False)
        body = {"master_address": self.address, "master_port": port, "world_size": world, "group_name": name, "backend": self.backend}
        with ThreadPoolExecutor(len(servers)) as pool:
            answers = [
                pool.submit(_post, f"{url}/init_weights_update_group", {**body, "rank_offset": offset}, self.timeout_s)
                for url, offset in zip(servers, offsets, strict=True)
            ]
            # SGLang's side wraps the rendezvous store in the group name; so does ours.
            group, _ = _new_process_group_helper(world, 0, [], Backend(self.backend), dist.PrefixStore(name, store), group_name=name, timeout=timeout)
            # What torch's own group constructors record, so that destroy_process_group can undo it.
            _world.pg_group_ranks[group] = {rank: rank for rank in range(world)}
            _raise_refusals(servers, [answer.result() for answer in answers])
        self._group, self._group_name, self._members = group, name, servers
        logger.info("weight-update group %s: trainer + %d servers (%d ranks)", name, len(servers), world)

    def _broadcast(self, version: int) -> None:
        servers = self._members
        _raise_refusals(servers, [_post(f"{url}/begin_weight_update", {"selector": "target"}, self.timeout_s) for url in servers])
        buckets = _buckets(self._weights, self.bucket_bytes)
        for i, names in enumerate(buckets):
            last = i == len(buckets) - 1
            body = {
                "names": names,
                "dtypes": [str(self.dtype).removeprefix("torch.")] * len(names),
                "shapes": [list(self._weights[n].shape) for n in names],
                "group_name": self._group_name,
                "load_format": "flattened_bucket",
                "selector": "target",
                "flush_cache": last,
                "weight_version": str(version) if last else None,
            }
            flat = torch.cat([self._weights[n].reshape(-1).view(torch.uint8) for n in names]).to(self.device)
            with ThreadPoolExecutor(len(servers)) as pool:
                answers = [pool.submit(_post, f"{url}/update_weights_from_distributed", body, self.timeout_s) for url in servers]
                dist.broadcast(flat, group=self._group, group_src=0)
                _raise_refusals(servers, [answer.result() for answer in answers])
        _raise_refusals(servers, [_post(f"{url}/end_weight_update", {}, self.timeout_s) for url in servers])


def _post(url: str, body: dict, timeout_s: float) -> str | None:
    """None when SGLang says it succeeded, else its answer."""
    answer = requests.post(url, json=body, timeout=timeout_s)
    if answer.status_code == 200 and answer.json().get("success", False):
        return None
    return f"{answer.status_code} {answer.text[:300]}"


def _raise_refusals(servers: Sequence[str], answers: list[str | None]) -> None:
    refused = [f"{url}: {answer}" for url, answer in zip(servers, answers, strict=True) if answer is not None]
    if refused:
        raise PublishFailed("; ".join(refused))


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]
