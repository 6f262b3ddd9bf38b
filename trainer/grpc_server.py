"""The gRPC face of the trainer (JobService): validate, call the job store or runner, translate errors."""

from __future__ import annotations

import grpc

from tlt.jobs.proto import event_to_proto, fields_of, job_to_proto
from tlt.jobs.records import JobRef, JobState, ListJobsRequest, WatchRequest
from tlt.jobs.spec import JobSpec
from tlt.rpc.service import build_grpc_server, call, message_fields, validated
from tlt.settings.trainer import TrainerSettings
from tlt.tasks import task_of
from tlt.v1 import jobs_pb2, jobs_pb2_grpc
from trainer.job_store import JobStore
from trainer.runner import JobRunner

SERVICE_NAME = jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name


def _checkpoint_problems(spec: JobSpec) -> str:
    """What is wrong with the spec's paths on this trainer's file system ('' when nothing)."""
    problems = []
    if not (spec.model_path / "config.json").is_file():
        problems.append(f"model_path: no HF checkpoint (config.json) at {spec.model_path}")
    if spec.drafter_path is not None and not (spec.drafter_path / "config.json").is_file():
        problems.append(f"drafter_path: no drafter checkpoint (config.json) at {spec.drafter_path}")
    if spec.dataset_path is not None:
        try:
            task_of(spec.task, spec.dataset_path)
        except (OSError, ValueError) as err:
            problems.append(f"dataset_path: {err}")
    return "; ".join(problems)


class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, store: JobStore, runner: JobRunner) -> None:
        self.store, self.runner = store, runner

    def SubmitJob(self, request, context):
        spec = validated(JobSpec, fields_of(request), context)
        if problems := _checkpoint_problems(spec):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problems)
        return job_to_proto(call(context, self.store.submit, spec))

    def GetJob(self, request, context):
        ref = validated(JobRef, message_fields(request), context)
        return job_to_proto(call(context, self.store.get, ref.job_id))

    def ListJobs(self, request, context):
        query = validated(ListJobsRequest, message_fields(request), context)
        records = call(context, self.store.list, JobState(query.state) if query.state else None, query.limit or 100)
        return jobs_pb2.JobList(jobs=[job_to_proto(r) for r in records])

    def CancelJob(self, request, context):
        ref = validated(JobRef, message_fields(request), context)
        return job_to_proto(call(context, self.runner.cancel, ref.job_id))

    def WatchJob(self, request, context):
        watch = validated(WatchRequest, message_fields(request), context)
        call(context, self.store.get, watch.job_id)  # NOT_FOUND before streaming
        after = watch.after_event_id or "0-0"
        while context.is_active():
            events = self.store.events(watch.job_id, after, block_ms=1000)
            for event in events:
                yield event_to_proto(event)
                after = event.event_id
                if event.state is not None and JobState(event.state).terminal:
                    return
            if not events and self.store.get(watch.job_id).state.terminal:
                return  # ended, and its final event was read before (or trimmed)


def build_server(settings: TrainerSettings, store: JobStore, runner: JobRunner) -> grpc.Server:
    """A gRPC server with the job service, health and reflection (not started)."""
    servicer = JobServicer(store, runner)
    return build_grpc_server(
        SERVICE_NAME,
        lambda server: jobs_pb2_grpc.add_JobServiceServicer_to_server(servicer, server),
        settings,
    )
