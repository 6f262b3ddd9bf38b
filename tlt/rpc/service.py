"""What every TLT gRPC service shares: requests validated through pydantic models (INVALID_ARGUMENT
names the fields), store errors mapped to status codes, an optional bearer token, the standard
health service and server reflection, message-size limits."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import BaseModel, SecretStr, ValidationError

from tlt.rpc.errors import AlreadyExists, Cancelled, FailedPrecondition, NotFound, ResourceExhausted
from tlt.rpc.settings import GrpcServerSettings

logger = logging.getLogger(__name__)
Request = TypeVar("Request", bound=BaseModel)

_STATUS: dict[type[Exception], grpc.StatusCode] = {
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ValueError: grpc.StatusCode.INVALID_ARGUMENT,
}


def validation_problems(err: ValidationError) -> str:
    """`field.sub: message; ...` for a status detail."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())


def validated(model: type[Request], fields: dict[str, Any], context: grpc.ServicerContext) -> Request:
    """The request's fields as a validated pydantic model; INVALID_ARGUMENT names the bad fields."""
    try:
        return model.model_validate(fields)
    except ValidationError as err:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, validation_problems(err))


def message_fields(message) -> dict[str, Any]:
    """Every field of a flat protobuf message (unset ones at their zero value)."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}


def call(context: grpc.ServicerContext, fn: Callable[..., Any], *args: Any, extra: dict[type[Exception], grpc.StatusCode] | None = None) -> Any:
    """Run a store call, mapping its errors to status codes (`extra` first; anything else propagates:
    gRPC reports it as UNKNOWN and the service logs it)."""
    try:
        return fn(*args)
    except Cancelled:
        context.abort(grpc.StatusCode.CANCELLED, "cancelled by the caller")
    except Exception as err:
        for kind, code in (*(extra or {}).items(), *_STATUS.items()):
            if isinstance(err, kind):
                context.abort(code, str(err))
        raise


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <token>`; health checks stay open (probes)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith("/grpc.health.v1.Health/"):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = str(metadata.get("authorization", "")).encode()
        if not hmac.compare_digest(given, self._expected):  # in constant time
            return self._deny
        return continuation(handler_call_details)


def bearer_metadata(token: str | SecretStr | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying a bearer token (empty without one)."""
    if isinstance(token, SecretStr):
        token = token.get_secret_value()
    return (("authorization", f"Bearer {token}"),) if token else ()


def client_channel(target: str, tls_ca_file: Path | None = None) -> grpc.Channel:
    """A channel to a TLT service: TLS verified against `tls_ca_file` when given, else plaintext."""
    if tls_ca_file is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=Path(tls_ca_file).read_bytes()))


def build_grpc_server(service_name: str, add_servicer: Callable[[grpc.Server], None], settings: GrpcServerSettings) -> grpc.Server:
    """A gRPC server (not started) with one service, health and reflection, listening on the
    settings' host and port (TLS when they name a certificate and key, else plaintext)."""
    auth_token, max_message_bytes, tls = settings.auth_token, settings.max_message_bytes, settings.tls()
    interceptors = [BearerTokenInterceptor(auth_token.get_secret_value())] if auth_token else []
    limits = [("grpc.max_receive_message_length", max_message_bytes), ("grpc.max_send_message_length", max_message_bytes)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.workers), interceptors=interceptors, options=limits)
    add_servicer(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in (service_name, ""):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if tls is not None:
        credentials = grpc.ssl_server_credentials([(tls[1].read_bytes(), tls[0].read_bytes())])
        bound = server.add_secure_port(f"{settings.host}:{settings.port}", credentials)
    else:
        bound = server.add_insecure_port(f"{settings.host}:{settings.port}")
    if bound == 0:
        raise OSError(f"cannot listen on {settings.host}:{settings.port}")
    return server
