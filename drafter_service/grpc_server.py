"""The gRPC face of the drafter service: parse, validate, call the store, translate errors. Also
serves gRPC health and server reflection, and checks an optional bearer token."""

from __future__ import annotations

import dataclasses
import logging

import grpc

from drafter_service.store import DrafterInfo, DrafterStore, Lease
from drafter_service.warmup import Warmup
from tlt.rpc import drafter_api as api
from tlt.rpc.service import build_grpc_server, call, message_fields, validated
from tlt.settings.drafter_service import DrafterServiceSettings
from tlt.store.weight_channel import BadBlob, CommitConflict
from tlt.v1 import drafter_pb2, drafter_pb2_grpc

logger = logging.getLogger(__name__)
SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["DrafterService"].full_name

_ERRORS = {CommitConflict: grpc.StatusCode.ABORTED, BadBlob: grpc.StatusCode.INVALID_ARGUMENT}


def _call(context: grpc.ServicerContext, fn, *args):
    return call(context, fn, *args, extra=_ERRORS)


def _valid(model, message, context):
    return validated(model, message_fields(message), context)


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
    def __init__(self, store: DrafterStore, warmup: Warmup, max_commit_bytes: int) -> None:
        self.store, self.warmup, self.max_commit_bytes = store, warmup, max_commit_bytes

    def RegisterDrafter(self, request, context):
        return _info(_call(context, self.store.register, _valid(api.RegisterDrafterRequest, request, context)))

    def GetDrafter(self, request, context):
        ref = _valid(api.DrafterRef, request, context)
        return _info(_call(context, self.store.info, ref.job_id))

    def Lease(self, request, context):
        return _grant(_call(context, self.store.lease, _valid(api.LeaseRequest, request, context)))

    def Heartbeat(self, request, context):
        return _grant(_call(context, self.store.heartbeat, _valid(api.LeaseRef, request, context)))

    def Commit(self, request, context):
        version = _call(context, self.store.commit, _valid(api.CommitRequest, request, context))
        return drafter_pb2.CommitResult(version=version)

    def CommitStream(self, request_iterator, context):
        first, pieces, size = None, [], 0
        for piece in request_iterator:
            if first is None:
                first = piece
            elif (piece.lease_id, piece.job_id) != (first.lease_id, first.job_id):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "lease_id, job_id: every piece must name the same lease")
            size += len(piece.weights)
            if size > self.max_commit_bytes:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"weights: more than {self.max_commit_bytes} bytes")
            pieces.append(piece.weights)
        if first is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no pieces")
        whole = drafter_pb2.CommitRequest(
            lease_id=first.lease_id, job_id=first.job_id, weights=b"".join(pieces), accept_length=first.accept_length
        )
        del pieces
        return self.Commit(whole, context)

    def Release(self, request, context):
        released = _call(context, self.store.release, _valid(api.LeaseRef, request, context))
        return drafter_pb2.ReleaseResult(released=released)

    def ExportDrafter(self, request, context):
        pieces = _call(context, lambda r: list(self.store.export(r)), _valid(api.ExportRequest, request, context))
        for path, offset, data, version in pieces:
            yield drafter_pb2.ExportChunk(path=path, offset=offset, data=data, version=version)

    def Warmup(self, request, context):
        events = self.warmup.run(_valid(api.WarmupRequest, request, context), context.is_active)
        try:
            while (event := _call(context, next, events, None)) is not None:
                yield drafter_pb2.WarmupProgress(**dataclasses.asdict(event))
        finally:
            events.close()  # a cancelled call stops the warm-up and gives its lease back


def build_server(settings: DrafterServiceSettings, store: DrafterStore) -> grpc.Server:
    """A gRPC server with the drafter service, health and reflection (not started)."""
    servicer = DrafterServicer(store, Warmup(store, settings.data_dir), settings.max_commit_bytes)
    return build_grpc_server(
        SERVICE_NAME,
        lambda server: drafter_pb2_grpc.add_DrafterServiceServicer_to_server(servicer, server),
        settings,
    )
