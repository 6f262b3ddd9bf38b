"""Client-side helpers of the drafter service."""

from __future__ import annotations

from collections.abc import Iterator

from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc

COMMIT_PIECE_BYTES = 4 * 1024 * 1024


def commit_pieces(lease_id: str, job_id: str, weights: bytes, accept_length: float, piece_bytes: int = COMMIT_PIECE_BYTES) -> Iterator[pb.CommitRequest]:
    """The messages of a `CommitStream` call: the blob in consecutive pieces, each naming the lease."""
    view = memoryview(weights)
    for offset in range(0, max(1, len(weights)), piece_bytes):
        yield pb.CommitRequest(lease_id=lease_id, job_id=job_id, weights=bytes(view[offset : offset + piece_bytes]), accept_length=accept_length)


def commit(
    stub: drafter_pb2_grpc.DrafterServiceStub,
    lease_id: str,
    job_id: str,
    weights: bytes,
    accept_length: float,
    metadata: tuple[tuple[str, str], ...] = (),
) -> int:
    """Commit a drafter of any size (streamed, so no gRPC message limit applies); its new version."""
    return stub.CommitStream(commit_pieces(lease_id, job_id, weights, accept_length), metadata=metadata).version
