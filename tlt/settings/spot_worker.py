"""Settings of `python -m rollout_server.spot_worker`, the spot-training sidecar of a rollout server."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from tlt.settings.common import NAME_PATTERN, Device, DeviceSettings, DType, process_flags


class SpotWorkerSettings(DeviceSettings):
    """Flags of `python -m rollout_server.spot_worker` (also `TLT_SPOT_*`; Redis: `TLT_REDIS_*`)."""

    model_config = process_flags("TLT_SPOT_", "python -m rollout_server.spot_worker")

    server_url: str = Field(description="the rollout server this worker sits beside, e.g. http://127.0.0.1:30000")
    drafter_service: str = Field(description="host:port of the drafter gRPC service")
    auth_token: SecretStr | None = Field(None, description="bearer token of the drafter service")
    tls_ca_file: Path | None = Field(None, description="CA to verify the drafter service's TLS with; unset: plaintext")
    job_id: str = Field(pattern=NAME_PATTERN)
    worker_id: str = Field(pattern=NAME_PATTERN, description="names this worker in leases and history")
    policy_path: Path = Field(
        description="HF checkpoint of the policy: the embeddings, LM head and rotary tables the drafter shares"
    )
    features: Literal["server", "local"] = Field(
        "server",
        description="where the policy's hidden states come from: the rollout server (needs "
        "--enable-return-hidden-states there, implied by --samples-job) or a local copy of the policy",
    )
    release_memory: Literal["auto", "on", "off"] = Field(
        "auto",
        description="pause the server and release its KV cache while a slice trains; auto: when the server "
        "runs with --enable-memory-saver (GPU)",
    )
    samples: int = Field(
        512, ge=8, le=100_000, description="the training window: the job's newest samples (two steps of the bundled job)"
    )
    epochs: int = Field(2, ge=1, le=1000, description="passes over the same samples before the worker waits for new ones")
    lr: float = Field(
        1e-4,
        gt=0,
        le=1.0,
        description="AdamW learning rate, constant; 1e-4 fine-tunes a converged drafter (the bundled one loses "
        "held-out accept length at 1e-3 and above), a fresh one learns fast at 2e-3",
    )
    min_new_samples: int = Field(32, ge=1, le=100_000, description="new samples that wake a worker whose data is used up")
    split_samples: bool = Field(
        True,
        description="train on this worker's share of the samples only (split by sample id among the job's live "
        "workers), so the workers of a job never compute the same training features twice (the held-out "
        "samples are measured on by every worker); off: each trains on all",
    )
    commit_z: float = Field(
        2.0,
        ge=0,
        le=10,
        description="commit a candidate when its paired held-out gain over the published version passes a one-sided test at "
        "the level of this many standard normal errors (Student's t on the held-out sequences: 2.03 errors over 64 at 2)",
    )
    update_slots: int | None = Field(
        None,
        ge=0,
        le=1024,
        description="at most this many workers of the job train inside the trainer's policy-update window "
        "(tlt:{job}:trainer:updating): for workers that share the trainer's CPU, as in tlt run (the cores "
        "the trainer leaves free; 0: stay out of it); unset: no limit, as on a cluster, where the update is "
        "the rollout pods' idle time",
    )
    idle_grace_s: float = Field(
        0.25, ge=0, le=3600, description="the server must stay idle this long first (a preempted slice loses nothing)"
    )
    poll_s: float = Field(0.2, gt=0, le=60, description="how often idleness is checked between slices")
    threads: int = Field(
        1,
        ge=1,
        le=256,
        description="torch threads for training on the CPU; more than the cores left free makes OpenMP "
        "spin against the rollout server (measured: the slice stalled until its neighbour went idle)",
    )
    nice: int = Field(
        0,
        ge=0,
        le=19,
        description="CPU priority of the worker's threads (Linux nice); 19 leaves the cores to everything else: "
        "for workers that share the trainer's CPU, with features=local so the feature prefills are niced too",
    )
    device: Device = Field(
        "auto",
        description="where slices train: on a GPU pod the GPU its idle server hands over (auto picks cuda when "
        "usable and refuses a GPU torch cannot use)",
    )
    dtype: DType = Field(
        "auto", description="dtype of the policy parts the drafter borrows (the serving one); auto: float32 on cpu, bfloat16 on cuda"
    )

