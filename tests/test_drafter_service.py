"""The drafter gRPC service as a real process over loopback, on a real Redis: every method, leases
that expire or are superseded, compare-and-set commits, auth, health, reflection, and fuzzed bad
inputs answered with proper status codes while the server stays up."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as load_blob
from safetensors.torch import load_file, save_file
from safetensors.torch import save as save_blob

from tlt.local.process import GrpcServiceProcess
from tlt.paths import BUNDLED_DRAFTER, BUNDLED_MODEL
from tlt.rpc.drafter_client import commit
from tlt.store.weight_channel import WeightChannel
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc

TOKEN = "test-token-123"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def service(redis_server, tmp_path_factory) -> Iterator[GrpcServiceProcess]:
    env = redis_server.client_env()
    log = tmp_path_factory.mktemp("drafter-service") / "service.log"
    args = ["--auth-token", TOKEN, "--lease-ttl-s", "2"]
    with GrpcServiceProcess("drafter_service", log, args=args, env=env).start(timeout_s=60) as process:
        yield process


@pytest.fixture(scope="module")
def stub(service) -> Iterator[drafter_pb2_grpc.DrafterServiceStub]:
    with grpc.insecure_channel(service.target) as channel:
        yield drafter_pb2_grpc.DrafterServiceStub(channel)


def _job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def _register(stub, job: str) -> pb.DrafterInfo:
    request = pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL), base_drafter_path=str(BUNDLED_DRAFTER))
    return stub.RegisterDrafter(request, metadata=AUTH)


def _weights(scale: float) -> bytes:
    return save_blob({name: t * scale for name, t in load_file(BUNDLED_DRAFTER / "model.safetensors").items()})


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


@pytest.mark.slow
def test_a_drafter_of_a_gigabyte_commits_in_pieces(redis_server, tmp_path: Path) -> None:
    """A 7B policy's drafter is about 1 GB in float32: over any one gRPC message's limit (the
    unary Commit refuses it), through CommitStream it commits, and verifies, like a small one."""
    args = ["--auth-token", TOKEN]  # the default lease TTL: a gigabyte takes seconds to move
    process = GrpcServiceProcess("drafter_service", tmp_path / "service.log", args=args, env=redis_server.client_env())
    with process.start(timeout_s=60), grpc.insecure_channel(process.target) as channel:
        _commit_a_gigabyte(drafter_pb2_grpc.DrafterServiceStub(channel), redis_server, tmp_path)


def _commit_a_gigabyte(stub, redis_server, tmp_path: Path) -> None:
    base = tmp_path / "big-drafter"
    base.mkdir()
    (base / "config.json").write_text((BUNDLED_DRAFTER / "config.json").read_text())
    big = {"layers.0.mlp.weight": torch.zeros(256, 1024 * 1024)}  # 2**28 float32: 1 GiB
    save_file(big, str(base / "model.safetensors"))
    job = _job()
    stub.RegisterDrafter(
        pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL), base_drafter_path=str(base)), metadata=AUTH
    )
    big["layers.0.mlp.weight"][7, 7] = 1.5
    weights = save_blob(big)
    del big
    assert len(weights) > 2**30
    grant = stub.Lease(pb.LeaseRequest(job_id=job, worker_id="pod-a"), metadata=AUTH)
    unary = pb.CommitRequest(lease_id=grant.lease_id, job_id=job, weights=weights, accept_length=2.0)
    assert _code(lambda: stub.Commit(unary, metadata=AUTH)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert commit(stub, grant.lease_id, job, weights, 2.0, AUTH) == 2
    manifest, blob = WeightChannel(redis_server.settings.client(), job, "drafter").read(2)
    assert manifest.size == len(weights) and blob == weights
    mixed = [
        pb.CommitRequest(lease_id=grant.lease_id, job_id=job, weights=b"x" * 16),
        pb.CommitRequest(lease_id="0" * 32, job_id=job, weights=b"y"),
    ]
    assert _code(lambda: stub.CommitStream(iter(mixed), metadata=AUTH)) == grpc.StatusCode.INVALID_ARGUMENT


def test_register_lease_commit_get_and_export(stub, tmp_path: Path) -> None:
    job = _job()
    info = _register(stub, job)
    assert info.latest_version == 1 and [v.version for v in info.history] == [1]
    assert _register(stub, job).latest_version == 1  # the same registration again: a no-op
    other = pb.RegisterDrafterRequest(job_id=job, policy_path="/elsewhere", base_drafter_path=str(BUNDLED_DRAFTER))
    assert _code(lambda: stub.RegisterDrafter(other, metadata=AUTH)) == grpc.StatusCode.ALREADY_EXISTS

    grant = stub.Lease(pb.LeaseRequest(job_id=job, worker_id="pod-a"), metadata=AUTH)
    assert grant.base_version == 1 and grant.expires_at > time.time()
    assert stub.GetDrafter(pb.DrafterRef(job_id=job), metadata=AUTH).active_lease_id == grant.lease_id
    # One slice at a time per drafter.
    busy = pb.LeaseRequest(job_id=job, worker_id="pod-b")
    assert _code(lambda: stub.Lease(busy, metadata=AUTH)) == grpc.StatusCode.FAILED_PRECONDITION
    renewed = stub.Heartbeat(pb.LeaseRef(lease_id=grant.lease_id, job_id=job), metadata=AUTH)
    assert renewed.expires_at >= grant.expires_at
    result = stub.Commit(pb.CommitRequest(lease_id=grant.lease_id, job_id=job, weights=_weights(0.5), accept_length=3.2), metadata=AUTH)
    assert result.version == 2

    info = stub.GetDrafter(pb.DrafterRef(job_id=job), metadata=AUTH)
    assert info.latest_version == 2 and info.active_lease_id == ""
    assert [(v.version, v.parent, v.committed_by) for v in info.history] == [(1, 0, "register"), (2, 1, "pod-a")]
    assert info.history[1].accept_length == pytest.approx(3.2)

    files: dict[str, bytearray] = {}
    for chunk in stub.ExportDrafter(pb.ExportRequest(job_id=job), metadata=AUTH):
        assert chunk.version == 2
        files.setdefault(chunk.path, bytearray()).extend(chunk.data)
    assert set(files) == {"config.json", "model.safetensors"}
    exported = load_blob(bytes(files["model.safetensors"]))
    expected = load_blob(_weights(0.5))
    assert all(torch.equal(exported[n], expected[n]) for n in expected)
    assert b"Qwen2ForCausalLMEagle" in files["config.json"]


def test_expired_released_and_superseded_leases_cannot_commit(stub) -> None:
    job = _job()
    _register(stub, job)
    first = stub.Lease(pb.LeaseRequest(job_id=job, worker_id="slow-pod", ttl_seconds=1), metadata=AUTH)
    time.sleep(1.3)  # the lease expires (Redis' clock)
    ref = pb.LeaseRef(lease_id=first.lease_id, job_id=job)
    assert _code(lambda: stub.Heartbeat(ref, metadata=AUTH)) == grpc.StatusCode.FAILED_PRECONDITION
    second = stub.Lease(pb.LeaseRequest(job_id=job, worker_id="fast-pod"), metadata=AUTH)
    late = pb.CommitRequest(lease_id=first.lease_id, job_id=job, weights=_weights(2.0))
    assert _code(lambda: stub.Commit(late, metadata=AUTH)) == grpc.StatusCode.FAILED_PRECONDITION
    assert stub.Release(pb.LeaseRef(lease_id=second.lease_id, job_id=job), metadata=AUTH).released
    assert not stub.Release(pb.LeaseRef(lease_id=second.lease_id, job_id=job), metadata=AUTH).released
    assert stub.GetDrafter(pb.DrafterRef(job_id=job), metadata=AUTH).latest_version == 1


def test_a_restarted_worker_takes_over_its_own_lease_but_not_anothers(stub) -> None:
    job = _job()
    _register(stub, job)
    dead = stub.Lease(pb.LeaseRequest(job_id=job, worker_id="pod-a"), metadata=AUTH)  # then killed -9
    other = pb.LeaseRequest(job_id=job, worker_id="pod-b")
    assert _code(lambda: stub.Lease(other, metadata=AUTH)) == grpc.StatusCode.FAILED_PRECONDITION
    restarted = stub.Lease(pb.LeaseRequest(job_id=job, worker_id="pod-a"), metadata=AUTH)
    assert restarted.lease_id != dead.lease_id
    stale = pb.CommitRequest(lease_id=dead.lease_id, job_id=job, weights=_weights(2.0))
    assert _code(lambda: stub.Commit(stale, metadata=AUTH)) == grpc.StatusCode.FAILED_PRECONDITION
    fresh = pb.CommitRequest(lease_id=restarted.lease_id, job_id=job, weights=_weights(2.0))
    assert stub.Commit(fresh, metadata=AUTH).version == 2


def test_commit_must_fit_the_drafter(stub) -> None:
    job = _job()
    _register(stub, job)
    grant = stub.Lease(pb.LeaseRequest(job_id=job, worker_id="pod"), metadata=AUTH)
    misfit = save_blob({"fc.weight": torch.zeros(3, 3)})
    bad = pb.CommitRequest(lease_id=grant.lease_id, job_id=job, weights=misfit)
    assert _code(lambda: stub.Commit(bad, metadata=AUTH)) == grpc.StatusCode.INVALID_ARGUMENT
    pickled = pb.CommitRequest(lease_id=grant.lease_id, job_id=job, weights=b"\x80\x04\x95" + b"\x00" * 40)
    assert _code(lambda: stub.Commit(pickled, metadata=AUTH)) == grpc.StatusCode.INVALID_ARGUMENT
    # A refused blob does not consume the lease.
    good = pb.CommitRequest(lease_id=grant.lease_id, job_id=job, weights=_weights(1.5))
    assert stub.Commit(good, metadata=AUTH).version == 2


def test_fresh_drafter_is_built_from_the_policy(stub) -> None:
    job = _job()
    info = stub.RegisterDrafter(pb.RegisterDrafterRequest(job_id=job, policy_path=str(BUNDLED_MODEL)), metadata=AUTH)
    assert info.latest_version == 1
    missing = pb.RegisterDrafterRequest(job_id=_job(), policy_path="/no/such/policy")
    assert _code(lambda: stub.RegisterDrafter(missing, metadata=AUTH)) == grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_jobs_and_invalid_fields(stub) -> None:
    assert _code(lambda: stub.GetDrafter(pb.DrafterRef(job_id="nobody"), metadata=AUTH)) == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.Lease(pb.LeaseRequest(job_id="bad id!", worker_id="w", ttl_seconds=99999), metadata=AUTH)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "job_id" in info.value.details() and "ttl_seconds" in info.value.details()


def test_calls_without_the_token_are_refused_but_health_and_reflection_answer(service, stub) -> None:
    assert _code(lambda: stub.GetDrafter(pb.DrafterRef(job_id="x"))) == grpc.StatusCode.UNAUTHENTICATED
    wrong = (("authorization", "Bearer nope"),)
    assert _code(lambda: stub.GetDrafter(pb.DrafterRef(job_id="x"), metadata=wrong)) == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(service.target) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="tlt.v1.DrafterService"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        answers = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=AUTH, timeout=5
        )
        names = {s.name for answer in answers for s in answer.list_services_response.service}
    assert "tlt.v1.DrafterService" in names


ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
}
text = st.text(max_size=80)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(
        ["GetDrafter", "Lease", "Heartbeat", "Commit", "Release", "ExportDrafter", "RegisterDrafter", "Warmup"]
    ),
    job=text,
    other=text,
    number=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    blob=st.binary(max_size=200),
)
def test_fuzzed_requests_get_clear_errors_and_the_server_stays_up(service, stub, method, job, other, number, blob) -> None:
    requests = {
        "GetDrafter": pb.DrafterRef(job_id=job),
        "Lease": pb.LeaseRequest(job_id=job, worker_id=other, ttl_seconds=number),
        "Heartbeat": pb.LeaseRef(job_id=job, lease_id=other),
        "Commit": pb.CommitRequest(job_id=job, lease_id=other, weights=blob, accept_length=float(number)),
        "Release": pb.LeaseRef(job_id=job, lease_id=other),
        "ExportDrafter": pb.ExportRequest(job_id=job, version=number),
        "RegisterDrafter": pb.RegisterDrafterRequest(job_id=job, policy_path=other, base_drafter_path=other),
        "Warmup": pb.WarmupRequest(job_id=job, dataset_path=other, epochs=number, max_samples=number),
    }
    try:
        answer = getattr(stub, method)(requests[method], metadata=AUTH, timeout=30)
        if method in ("ExportDrafter", "Warmup"):
            list(answer)
    except grpc.RpcError as err:
        assert err.code() in ALLOWED, (err.code(), err.details())
    assert service.alive()
