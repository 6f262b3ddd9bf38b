"""The first thing to run on a GPU node with the TLT image: an ordered check of the GPU paths, a
PASS/FAIL line per step, about 5 minutes with a small model. `tools/gpu_smoke.sh` runs it.

    python tools/gpu_smoke.py --model /models/Qwen2.5-0.5B-Instruct [--draft /models/eagle-draft]

Without --draft a fresh (untrained) EAGLE draft is made for the model: every path runs, acceptance
stays near 1. `--device cpu` runs the same steps on the CPU with the bundled model (no memory
release there: SGLang's needs CUDA); the project's tests use it to keep this script working.
Exit status: the number of failed steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout or from the image's /app

JOB = "gpu-smoke"


class Smoke:
    """Runs steps in order; a failed step is reported and the rest still run where they can."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.ran = 0
        self.state: dict = {}

    def step(self, name: str, check: Callable[[], str]) -> None:
        started = time.monotonic()
        self.ran += 1
        try:
            detail = check()
            print(f"PASS  {name} ({time.monotonic() - started:.1f} s): {detail}", flush=True)
        except Exception as err:  # noqa: BLE001 (every failure is a FAIL line, then the next step)
            self.failed.append(name)
            print(f"FAIL  {name} ({time.monotonic() - started:.1f} s): {type(err).__name__}: {err}", flush=True)
            traceback.print_exc(limit=3)


def _metric(url: str, name: str) -> float:
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _generate(url: str, prompts: list[list[int]], temperature: float, max_new_tokens: int) -> list[dict]:
    body = {"input_ids": prompts, "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens}}
    answer = requests.post(f"{url}/generate", json=body, timeout=600)
    answer.raise_for_status()
    return answer.json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="HF checkpoint (default: the bundled tiny model, CPU only)")
    parser.add_argument("--draft", type=Path, help="SGLang EAGLE draft checkpoint (default: a fresh one)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--work-dir", type=Path, help="logs and scratch files (default: a temporary directory)")
    parser.add_argument("--concurrency", type=int, default=256, help="the large batch")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="tlt-gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    smoke = Smoke()
    print(f"TLT GPU smoke test: device {args.device}, logs in {work}", flush=True)

    def imports_and_driver() -> str:
        import torch

        if args.device == "cpu":
            return f"torch {torch.__version__} (CPU run: no driver check)"
        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: driver 580+ is needed for CUDA 13.0")
        import flashinfer  # noqa: F401 (the attention kernels SGLang uses on GPUs)
        import sgl_kernel  # noqa: F401

        x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        (x @ x).sum().item()
        props = torch.cuda.get_device_properties(0)
        return f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__} CUDA {torch.version.cuda}, bf16 matmul ok"

    smoke.step("imports and driver", imports_and_driver)

    from tlt.local.process import GrpcServiceProcess, RolloutServerProcess
    from tlt.local.redis_server import EmbeddedRedis
    from tlt.paths import BUNDLED_MODEL

    model = args.model or BUNDLED_MODEL
    if args.model is None and args.device == "cuda":
        print("note: no --model given; the bundled tiny model (character vocabulary) stands in", flush=True)
    redis_server = EmbeddedRedis(log_path=work / "redis.log").start()
    env = redis_server.client_env()
    processes: list = []
    try:

        def draft_checkpoint() -> str:
            if args.draft is not None:
                smoke.state["draft"] = args.draft
                return f"given: {args.draft}"
            import torch
            from transformers import AutoConfig

            from tlt.drafter.model import EagleDrafter, export_sglang_checkpoint

            torch.manual_seed(0)
            out = work / "fresh-draft"
            export_sglang_checkpoint(EagleDrafter(AutoConfig.from_pretrained(model)), out)
            smoke.state["draft"] = out
            return f"a fresh EAGLE draft for {model.name} in {out}"

        smoke.step("EAGLE draft checkpoint", draft_checkpoint)

        def rollout_server() -> str:
            server_args = ["--device", args.device, "--speculative", "adaptive", "--draft-model-path", str(smoke.state["draft"])]
            server_args += ["--drafter-job", JOB, "--samples-job", JOB, "--enable-metrics", "--random-seed", "0"]
            if args.device == "cuda":
                server_args += ["--enable-memory-saver"]
            server = RolloutServerProcess(model, work / "rollout-server.log", args=server_args, env=env)
            processes.append(server)
            server.start(timeout_s=900)
            smoke.state["server"] = server
            info = requests.get(f"{server.url}/get_server_info", timeout=30).json()
            dtype = info.get("dtype")
            if args.device == "cuda" and dtype != "bfloat16":
                raise RuntimeError(f"serving in {dtype}, not bfloat16")
            return f"{server.url}, dtype {dtype}, speculative adaptive, memory saver {info.get('enable_memory_saver')}"

        smoke.step("rollout server with an EAGLE draft", rollout_server)

        def requests_at_both_sizes() -> str:
            from transformers import AutoTokenizer

            url = smoke.state["server"].url
            tokenizer = AutoTokenizer.from_pretrained(model)
            prompt = tokenizer("Question: what is 12 times 7? Think step by step.").input_ids
            greedy = [_generate(url, [prompt], 0.0, 64)[0]["output_ids"] for _ in range(2)]
            if greedy[0] != greedy[1]:
                raise RuntimeError("two greedy generations of one prompt differ")
            verified_before = _metric(url, "tlt_sd_choices_total")
            _generate(url, [prompt], 1.0, 64)
            with ThreadPoolExecutor(8) as pool:  # concurrency: 256 requests in flight as one batch
                list(pool.map(lambda i: _generate(url, [prompt] * (args.concurrency // 8), 1.0, 64), range(8)))
            choices = _metric(url, "tlt_sd_choices_total") - verified_before
            if choices <= 0:
                raise RuntimeError("tlt_sd_choices_total did not move: the bandit chose nothing")
            return f"greedy reproducible, sampled at 1 and {args.concurrency}, {choices:.0f} bandit decisions"

        smoke.step("greedy and sampled requests at concurrency 1 and large", requests_at_both_sizes)

        def drafter_swap() -> str:
            from safetensors.torch import load_file

            from tlt.store.weight_channel import WeightChannel

            url = smoke.state["server"].url
            tensors = load_file(Path(smoke.state["draft"]) / "model.safetensors")
            channel = WeightChannel(redis_server.settings.client(), JOB, "drafter")
            manifest = channel.publish({name: t * 0.5 for name, t in tensors.items()}, parent=channel.latest_version())
            deadline = time.monotonic() + 60
            while _metric(url, "tlt_drafter_version") != manifest.version:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"drafter v{manifest.version} not swapped in within 60 s")
                _generate(url, [[1, 2, 3]], 0.0, 2)  # swaps happen between batches
            return f"drafter v{manifest.version} serving"

        smoke.step("drafter blob swapped in", drafter_swap)

        def hand_off() -> str:
            from rollout_server.memory_handoff import MemoryHandOff

            url = smoke.state["server"].url
            release = args.device == "cuda"
            with MemoryHandOff(url, release=release):
                pass
            out = _generate(url, [[1, 2, 3]], 0.0, 8)[0]
            if not out["output_ids"]:
                raise RuntimeError("no tokens after the hand-off")
            return "pause, release, resume, continue; then generates" if release else "pause, continue (CPU: no release)"

        smoke.step("KV-cache hand-off cycle", hand_off)

        def spot_training_commit() -> str:
            import grpc
            import torch

            from rollout_server.server_features import ServerFeatures
            from rollout_server.spot_worker import SpotWorker, SpotWorkerConfig, spot_training
            from tlt.rollout.client import server_load
            from tlt.store.samples_stream import SamplesStream
            from tlt.store.weight_channel import WeightChannel
            from tlt.v1 import drafter_pb2 as pb
            from tlt.v1 import drafter_pb2_grpc

            url = smoke.state["server"].url
            service = GrpcServiceProcess("drafter_service", work / "drafter-service.log", env=env)
            processes.append(service)
            service.start(timeout_s=120)
            with grpc.insecure_channel(service.target) as channel:
                stub = drafter_pb2_grpc.DrafterServiceStub(channel)
                # A job of its own: its base is the draft's own checkpoint.
                job = f"{JOB}-spot"
                stub.RegisterDrafter(pb.RegisterDrafterRequest(job_id=job, policy_path=str(model), base_drafter_path=str(smoke.state["draft"])))
                client = redis_server.settings.client()
                samples = SamplesStream(client, job)
                samples.add_many([record for _, record in SamplesStream(client, JOB).read(count=10_000)])
                worker = SpotWorker(
                    SpotWorkerConfig(job_id=job, worker_id="smoke", policy_path=str(model), samples=64, training=spot_training(2)),
                    WeightChannel(client, job, "drafter"), samples, stub, lambda: server_load(url) > 0,
                    features=ServerFeatures(url).many, device=args.device,
                    dtype=torch.bfloat16 if args.device == "cuda" else torch.float32,
                )  # fmt: skip
                result = worker.run_slice()
            if result.preempted:
                raise RuntimeError("the slice was preempted (is the server idle?)")
            if result.version is None:
                raise RuntimeError(f"trained {result.steps} steps but did not improve: {result.accept_length_before:.2f} -> {result.accept_length:.2f}")
            return f"v{result.version} committed after {result.steps} steps ({result.accept_length_before:.2f} -> {result.accept_length:.2f})"

        smoke.step("spot-training slice committed", spot_training_commit)
    finally:
        for process in reversed(processes):
            process.stop()
        redis_server.stop()
    print(json.dumps({"passed": smoke.ran - len(smoke.failed), "failed": smoke.failed}), flush=True)
    return len(smoke.failed)


if __name__ == "__main__":
    sys.exit(main())
