"""A client of the trainer's job API (JobService) speaking TLT's models: used by the CLI, `tlt run`
and the benchmarks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Self

from tlt.jobs.proto import event_from_proto, spec_to_proto
from tlt.jobs.records import JobEvent
from tlt.jobs.spec import JobSpec
from tlt.rpc.service import bearer_metadata, client_channel
from tlt.v1 import jobs_pb2 as pb
from tlt.v1 import jobs_pb2_grpc


class JobClient:
    def __init__(self, target: str, token: str | None = None, timeout_s: float = 60.0, tls_ca_file: Path | None = None) -> None:
        self._channel = client_channel(target, tls_ca_file)
        self.stub = jobs_pb2_grpc.JobServiceStub(self._channel)
        self._metadata, self._timeout_s = bearer_metadata(token), timeout_s

    def submit(self, spec: JobSpec | pb.JobSpec) -> pb.Job:
        """Submit a validated spec (or a raw message: the trainer validates it)."""
        message = spec_to_proto(spec) if isinstance(spec, JobSpec) else spec
        return self.stub.SubmitJob(message, metadata=self._metadata, timeout=self._timeout_s)

    def get(self, job_id: str) -> pb.Job:
        return self.stub.GetJob(pb.JobRef(job_id=job_id), metadata=self._metadata, timeout=self._timeout_s)

    def list(self, state: str = "", limit: int = 0) -> list[pb.Job]:
        request = pb.ListJobsRequest(state=state, limit=limit)
        return list(self.stub.ListJobs(request, metadata=self._metadata, timeout=self._timeout_s).jobs)

    def cancel(self, job_id: str) -> pb.Job:
        return self.stub.CancelJob(pb.JobRef(job_id=job_id), metadata=self._metadata, timeout=self._timeout_s)

    def watch(self, job_id: str, after_event_id: str = "") -> Iterator[JobEvent]:
        """The job's events until it ends (the stream is cancelled when the iterator is closed)."""
        call = self.stub.WatchJob(pb.WatchRequest(job_id=job_id, after_event_id=after_event_id), metadata=self._metadata)
        try:
            for message in call:
                yield event_from_proto(message)
        finally:
            call.cancel()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_) -> None:
        self.close()
