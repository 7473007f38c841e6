"""Multi-instance jobs on backend=pai, against the PAI emulator over real HTTP.

The emulator runs a job of EcsCount 2 as DLC does: two containers of the torch test image on
a network of the job's, each with DLC's distributed variables (computed by the emulator
itself), per-instance status in GetTrainingJob's Instances[] and logs by WorkerId.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, all_runs, mlflow_client, run_paiexp
from ddp_helpers import assert_trained_in_step
from emulator import Emulator
from emulator.runners import ROOT_LABEL
from test_pai_backend import pai_env, pai_overrides

pytestmark = pytest.mark.slow


@pytest.fixture
def torch_cloud(tmp_path: Path, torch_image: str) -> Iterator[Emulator]:
    with Emulator(tmp_path / "cloud", local_images={"default": torch_image}) as emulator:
        yield emulator
        assert not emulator.pai.leaked_containers()
    left = [n for n in emulator_networks() if n["Labels"][ROOT_LABEL].startswith(str(tmp_path))]
    assert left == [], left  # every job's network removed with it


def emulator_networks() -> list[dict[str, Any]]:
    import docker

    return list(docker.from_env().api.networks(filters={"label": ROOT_LABEL}))


def project(root: Path) -> Path:
    root.mkdir()
    for name in ("conf", "examples"):
        (root / name).symlink_to(REPO / name)
    return root


def test_the_ddp_example_trains_on_two_pai_instances(torch_cloud: Emulator, tmp_path: Path) -> None:
    root = project(tmp_path / "project")
    done = run_paiexp(
        root, "job=ddp", "job.hyperparameters.epochs=3", *pai_overrides(torch_cloud),
        env=pai_env(torch_cloud),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (job,) = torch_cloud.jobs()
    assert job["ComputeResource"]["EcsCount"] == 2
    assert [(i["Role"], i["Status"]) for i in job["Instances"]] == [
        ("Master", "Succeed"),
        ("Worker", "Succeed"),
    ]
    client = mlflow_client(root)
    (run,) = all_runs(root)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2]
    name = job["TrainingJobName"]
    directory = tmp_path / "downloaded"
    logs = {
        instance: Path(
            client.download_artifacts(
                run.info.run_id, f"logs/{name}/{instance}.log", str(directory)
            )
        ).read_text()
        for instance in ("master-0", "worker-0")
    }
    assert_trained_in_step(logs)
    model = [k for k in torch_cloud.store.keys(torch_cloud.bucket) if "/model/" in k]
    assert [k.rsplit("/", 1)[1] for k in model] == ["model.pt"]


def test_a_failing_instance_fails_the_pai_job_naming_it(
    torch_cloud: Emulator, tmp_path: Path
) -> None:
    root = project(tmp_path / "project")
    # the master waits for the test's end (it is stopped); the worker fails at once
    command = 'if [ "$RANK" = 1 ]; then echo "bad shard"; exit 1; fi; exec sleep 300'
    done = run_paiexp(
        root, f"job.command='{command}'", "job.instance_count=2", "job.max_run_time=120",
        *pai_overrides(torch_cloud), env=pai_env(torch_cloud),
    )  # fmt: skip
    assert done.returncode != 0
    (job,) = torch_cloud.jobs()
    assert job["Status"] == "Failed"
    assert [(i["Role"], i["Status"]) for i in job["Instances"]] == [
        ("Master", "Terminated"),
        ("Worker", "Failed"),
    ]
    (run,) = all_runs(root)
    assert run.info.status == "FAILED"
    reason = run.data.tags.get("paiexp.failure_reason", "") + done.stderr
    assert "worker-0 failed: PAI Failed" in reason
