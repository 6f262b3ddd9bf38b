"""A job with no trained drafter: `tlt run` starts the servers on a fresh drafter that is, tensor
for tensor, the drafter service's version 1 of the job."""

from __future__ import annotations

from safetensors.torch import load_file

from drafter_service.store import checkpoint_files
from tlt.jobs.spec import JobSpec
from tlt.local.cluster import LocalCluster
from tlt.paths import BUNDLED_FRESH_JOB, BUNDLED_MODEL
from tlt.rpc import drafter_api as api


def test_the_servers_first_drafter_is_the_services_version_1(tmp_path) -> None:
    spec = JobSpec.from_yaml(BUNDLED_FRESH_JOB)
    assert spec.drafter_path is None and spec.model_path == BUNDLED_MODEL.resolve()
    cluster = LocalCluster(spec, tmp_path, tmp_path / "run")
    first = cluster._first_drafter()
    served = load_file(str(first / "model.safetensors"))
    _, registered = checkpoint_files(api.RegisterDrafterRequest(job_id=spec.name, policy_path=str(spec.model_path)))
    assert served.keys() == registered.keys()
    assert all(served[name].equal(registered[name]) for name in served)
