"""A script's own MLflow calls (``mlflow.xgboost.autolog``, ``log_param``, ``log_metric``)
land in its job's run, as a single run and as a sweep's trials, on local, docker and the PAI
emulator: params, metrics, tags, artifacts, datasets and the model, each in its own run and
no other; no MLflow store in the job's working directory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import all_runs, clean_env, mlflow_client, run_paiexp
from job_mlflow_helpers import CLASH, JOB, check_run, load_model, no_stray_store, write_project

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command


@dataclass
class Place:
    """A backend as the command line selects it, and where its jobs' working directories are."""

    overrides: list[str]
    env: dict[str, str] = field(default_factory=clean_env)
    jobs: Path | None = None  # under which */ml/usercode are the jobs' working directories


@pytest.fixture(
    params=[
        pytest.param("local"),
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("pai", marks=[pytest.mark.docker, pytest.mark.slow]),
    ]
)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "local":
        yield Place([])
    elif request.param == "docker":
        image = request.getfixturevalue("mlflow_image")
        yield Place(["backend=docker", f"backend.image={image}"])
    else:  # its jobs in containers of the mlflow image, their outputs on its OSS
        from emulator import Emulator
        from test_pai_backend import pai_env, pai_overrides

        image = request.getfixturevalue("mlflow_image")
        with Emulator(tmp_path / "cloud", local_images={"default": image}) as cloud:
            yield Place(pai_overrides(cloud), pai_env(cloud), tmp_path / "cloud")


def working_dirs(project: Path, place: Place) -> list[Path]:
    return sorted((place.jobs or project / ".paiexp").glob("**/ml/usercode"))


def test_a_single_runs_own_mlflow_calls_land_in_its_run(project: Path, place: Place) -> None:
    write_project(project)
    result = run_paiexp(project, f"job={JOB}", "-q", *place.overrides, env=place.env)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "warning" in line] == [
        f"[paiexp] warning: job {all_runs(project)[0].data.tags['paiexp.job_name']}: {CLASH}"
    ]  # its declared own_metric logged, its model logged with MLflow: no warning of either
    client = mlflow_client(project)
    (run,) = all_runs(project)  # the job's run, and no other run anywhere in the tracker
    check_run(client, run, depth=3)
    model = load_model(client, run)
    assert model.predict(__import__("xgboost").DMatrix(np.zeros((2, 4)))).shape == (2,)
    no_stray_store(working_dirs(project, place))


def test_a_sweeps_trials_own_mlflow_calls_land_in_their_runs(project: Path, place: Place) -> None:
    write_project(project)
    grid = ["-m", "job.hyperparameters.max_depth=2,4", "sweep.parallelism=2"]
    result = run_paiexp(project, f"job={JOB}", "-q", *grid, *place.overrides, env=place.env)
    assert result.returncode == 0, result.stderr
    assert sum("its own MLflow" in line for line in result.stderr.splitlines()) == 2
    assert "model channel empty" not in result.stderr  # each logged its model with MLflow
    client = mlflow_client(project)
    runs = all_runs(project)
    (parent,) = [run for run in runs if run.data.tags.get("paiexp.kind") == "sweep"]
    trials = {int(run.data.params["max_depth"]): run for run in runs if run is not parent}
    assert sorted(trials) == [2, 4]
    for depth, run in trials.items():
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        check_run(client, run, depth)  # its own points only, its own model
    assert "own_param" not in parent.data.params
    assert not client.get_metric_history(parent.info.run_id, "own_metric")
    no_stray_store(working_dirs(project, place))


def test_the_launchers_own_mlflow_variables_never_reach_a_job(project: Path) -> None:
    """The launcher's MLFLOW_RUN_ID and MLFLOW_EXPERIMENT_NAME (a launcher started inside an
    MLflow run, say) would send the job's calls elsewhere, or fail its start_run; its
    MLFLOW_TRACKING_URI is paiexp's own tracker, not the job's."""
    write_project(project)
    env = clean_env(
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}",
        MLFLOW_RUN_ID="0123456789abcdef0123456789abcdef",
        MLFLOW_EXPERIMENT_NAME="stray",
    )
    result = run_paiexp(project, f"job={JOB}", "-q", env=env)
    assert result.returncode == 0, result.stderr
    client = mlflow_client(project)
    (run,) = all_runs(project)
    check_run(client, run, depth=3)
    assert client.get_experiment_by_name("stray") is None
    store = project.glob(".paiexp/jobs/*/ml/output/paiexp_mlflow/mlruns/*/meta.yaml")
    assert [path.parent.name for path in store] == ["0"]  # the job's own default experiment
