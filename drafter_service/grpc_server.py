"""The gRPC face of the drafter service: parse, validate, call the store, translate errors. Also
serves gRPC health and server reflection, and checks an optional bearer token."""

from __future__ import annotations

import dataclasses
import logging
from concurrent import futures
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import BaseModel, ValidationError

from drafter_service.store import (
    AlreadyExists,
    DrafterInfo,
    DrafterStore,
    FailedPrecondition,
    Lease,
    NotFound,
)
from drafter_service.warmup import Cancelled, Warmup
from tlt import drafter_api as api
from tlt.settings import DrafterServiceSettings
from tlt.v1 import drafter_pb2, drafter_pb2_grpc
from tlt.weight_channel import BadBlob, CommitConflict

logger = logging.getLogger(__name__)
SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["DrafterService"].full_name

Request = TypeVar("Request", bound=BaseModel)


def validated(model: type[Request], message, context: grpc.ServicerContext) -> Request:
    """The protobuf message as a validated pydantic request; INVALID_ARGUMENT names the fields."""
    fields = {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}
    try:
        return model.model_validate(fields)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, problems)


def _call(context: grpc.ServicerContext, fn, *args):
    """Run a store call, mapping its errors to status codes (anything else: INTERNAL, logged)."""
    try:
        return fn(*args)
    except NotFound as err:
        context.abort(grpc.StatusCode.NOT_FOUND, str(err))
    except AlreadyExists as err:
        context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err))
    except FailedPrecondition as err:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
    except CommitConflict as err:
        context.abort(grpc.StatusCode.ABORTED, str(err))
    except (BadBlob, ValueError) as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    except Cancelled:
        context.abort(grpc.StatusCode.CANCELLED, "cancelled by the caller")


def _info(info: DrafterInfo) -> drafter_pb2.DrafterInfo:
    return drafter_pb2.DrafterInfo(
        job_id=info.job_id,
        policy_path=info.policy_path,
        latest_version=info.latest_version,
        history=[drafter_pb2.DrafterVersion(**v.model_dump()) for v in info.history],
        active_lease_id=info.active_lease_id,
    )


def _grant(lease: Lease) -> drafter_pb2.LeaseGrant:
    return drafter_pb2.LeaseGrant(
        lease_id=lease.lease_id, job_id=lease.job_id, base_version=lease.base_version, expires_at=lease.expires_at
    )


class DrafterServicer(drafter_pb2_grpc.DrafterServiceServicer):
    def __init__(self, store: DrafterStore, warmup: Warmup) -> None:
        self.store, self.warmup = store, warmup

    def RegisterDrafter(self, request, context):
        return _info(_call(context, self.store.register, validated(api.RegisterDrafterRequest, request, context)))

    def GetDrafter(self, request, context):
        ref = validated(api.DrafterRef, request, context)
        return _info(_call(context, self.store.info, ref.job_id))

    def Lease(self, request, context):
        return _grant(_call(context, self.store.lease, validated(api.LeaseRequest, request, context)))

    def Heartbeat(self, request, context):
        return _grant(_call(context, self.store.heartbeat, validated(api.LeaseRef, request, context)))

    def Commit(self, request, context):
        version = _call(context, self.store.commit, validated(api.CommitRequest, request, context))
        return drafter_pb2.CommitResult(version=version)

    def Release(self, request, context):
        released = _call(context, self.store.release, validated(api.LeaseRef, request, context))
        return drafter_pb2.ReleaseResult(released=released)

    def ExportDrafter(self, request, context):
        pieces = _call(context, lambda r: list(self.store.export(r)), validated(api.ExportRequest, request, context))
        for path, offset, data, version in pieces:
            yield drafter_pb2.ExportChunk(path=path, offset=offset, data=data, version=version)

    def Warmup(self, request, context):
        events = self.warmup.run(validated(api.WarmupRequest, request, context), context.is_active)
        try:
            while (event := _call(context, next, events, None)) is not None:
                yield drafter_pb2.WarmupProgress(**dataclasses.asdict(event))
        finally:
            events.close()  # a cancelled call stops the warm-up and gives its lease back


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <token>`; health checks stay open (probes)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith("/grpc.health.v1.Health/"):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        if metadata.get("authorization") != self._expected:
            return self._deny
        return continuation(handler_call_details)


def build_server(settings: DrafterServiceSettings, store: DrafterStore) -> grpc.Server:
    """A gRPC server with the drafter service, health and reflection (not started)."""
    interceptors = [BearerTokenInterceptor(settings.auth_token.get_secret_value())] if settings.auth_token else []
    limits = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.workers), interceptors=interceptors, options=limits)
    servicer = DrafterServicer(store, Warmup(store, settings.data_dir))
    drafter_pb2_grpc.add_DrafterServiceServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in (SERVICE_NAME, ""):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if server.add_insecure_port(f"{settings.host}:{settings.port}") == 0:
        raise OSError(f"cannot listen on {settings.host}:{settings.port}")
    return server
