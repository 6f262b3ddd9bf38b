"""The trainer's side of the drafter service: register a job's drafter when the job starts. (Its
newest version, for the step metrics, is read from the drafter weight channel in Redis, so a
restarting drafter service never holds up a step.)"""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from tlt.jobs.spec import JobSpec
from tlt.rpc.service import bearer_metadata, client_channel
from tlt.v1 import drafter_pb2 as pb
from tlt.v1 import drafter_pb2_grpc


class DrafterLink:
    def __init__(self, target: str, token: SecretStr | None = None, timeout_s: float = 60.0, tls_ca_file: Path | None = None) -> None:
        self._channel = client_channel(target, tls_ca_file)
        self._stub = drafter_pb2_grpc.DrafterServiceStub(self._channel)
        self._metadata, self._timeout_s = bearer_metadata(token), timeout_s

    def register(self, spec: JobSpec) -> int:
        """Register the job's drafter (its base drafter becomes version 1; registering again, as a
        resumed job does, keeps the versions). Returns the newest version."""
        request = pb.RegisterDrafterRequest(
            job_id=spec.name, policy_path=str(spec.model_path), base_drafter_path=str(spec.drafter_path or "")
        )
        answer = self._stub.RegisterDrafter(request, metadata=self._metadata, timeout=self._timeout_s, wait_for_ready=True)
        return answer.latest_version

    def close(self) -> None:
        self._channel.close()
