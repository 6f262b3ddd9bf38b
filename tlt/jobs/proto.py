"""Between the job models of `tlt.jobs.spec` / `tlt.jobs.records` and the protobuf messages of
`proto/tlt/v1/jobs.proto`. Unset optional fields stay unset, so the pydantic defaults apply."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from tlt.jobs.records import JobEvent, JobRecord, StepMetrics
from tlt.jobs.spec import JobSpec
from tlt.v1 import jobs_pb2 as pb


def fields_of(message: Message) -> dict[str, Any]:
    """The fields a sender set (recursively), for pydantic to validate and default the rest."""
    return {
        field.name: fields_of(value) if field.message_type is not None else value
        for field, value in message.ListFields()
    }


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    data = spec.model_dump(mode="json", exclude_none=True)
    return pb.JobSpec(**{k: v for k, v in data.items() if k != "grpo"}, grpo=pb.GrpoConfig(**data["grpo"]))


def metrics_to_proto(metrics: StepMetrics) -> pb.StepMetrics:
    return pb.StepMetrics(**metrics.model_dump())


def metrics_from_proto(message: pb.StepMetrics) -> StepMetrics:
    fields = {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}
    return StepMetrics(**{**fields, "samples_by_server": dict(message.samples_by_server)})


def job_to_proto(record: JobRecord) -> pb.Job:
    return pb.Job(
        job_id=record.job_id,
        spec=spec_to_proto(record.spec),
        state=record.state.value,
        steps_done=record.steps_done,
        message=record.message,
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        last_step=metrics_to_proto(record.last_step) if record.last_step else None,
        checkpoint=record.checkpoint,
        resumed=record.resumed,
    )


def event_from_proto(message: pb.JobEvent) -> JobEvent:
    common = {"event_id": message.event_id, "job_id": message.job_id, "time": message.time}
    if message.WhichOneof("kind") == "step":
        return JobEvent(**common, step=metrics_from_proto(message.step))
    change = message.state
    return JobEvent(
        **common, state=change.state, message=change.message, steps_done=change.steps_done, eval_accuracy=change.eval_accuracy
    )


def event_to_proto(event: JobEvent) -> pb.JobEvent:
    message = pb.JobEvent(event_id=event.event_id, job_id=event.job_id, time=event.time)
    if event.step is not None:
        message.step.CopyFrom(metrics_to_proto(event.step))
    else:
        message.state.CopyFrom(
            pb.StateChange(
                state=event.state or "", message=event.message, steps_done=event.steps_done, eval_accuracy=event.eval_accuracy
            )
        )
    return message
