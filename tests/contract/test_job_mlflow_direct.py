"""``tracker.job_uri``: a single run's job that reaches the tracking server writes its own
MLflow calls into its run there itself (``MLFLOW_RUN_ID``: ``start_run`` resumes the run), with
the launcher's credentials in its environment only: on local, and on the PAI emulator (its
jobs as processes of this machine, which reach the server's loopback address)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import clean_env, run_paiexp
from job_mlflow_helpers import JOB, write_project

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

TOKEN = "s3cret-token-value"  # the launcher's MLFLOW_TRACKING_TOKEN: the job's alone


@dataclass
class Place:
    overrides: list[str]
    env: dict[str, str] = field(default_factory=clean_env)
    jobs: Path | None = None  # where the jobs' directories are (None: the project's .paiexp)


@pytest.fixture(params=["local", pytest.param("pai", marks=pytest.mark.slow)])
def place(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Place]:
    if request.param == "local":
        yield Place([], clean_env(MLFLOW_TRACKING_TOKEN=TOKEN))
        return
    from emulator import Emulator
    from test_pai_backend import pai_env, pai_overrides

    root = tmp_path_factory.mktemp("cloud")  # beside the project: PAI keeps what it is sent
    with Emulator(root) as cloud:  # its jobs run as processes of this machine
        env = {**pai_env(cloud), "MLFLOW_TRACKING_TOKEN": TOKEN}
        yield Place(pai_overrides(cloud), env, root)


def test_a_job_that_reaches_the_server_writes_into_its_run_itself(
    project: Path, place: Place, mlflow_server: str
) -> None:
    from mlflow.tracking import MlflowClient

    write_project(project)
    experiment = f"direct-{place.jobs is not None}"
    result = run_paiexp(
        project,
        f"job={JOB}",
        "-q",
        "job.hyperparameters.eta=0.3",  # autolog's own: no clash (MLflow's rule, directly)
        "job.command='python train.py && printenv MLFLOW_TRACKING_TOKEN >/dev/null && echo "
        "token=given'",
        f"tracker.uri={mlflow_server}",
        f"tracker.job_uri={mlflow_server}",
        f"tracker.experiment={experiment}",
        *place.overrides,
        env=place.env,
    )
    assert result.returncode == 0, result.stderr
    assert "never logged" not in result.stderr  # its declared own_metric: in its run, not a store
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["own_param"] == "depth-3"
    assert run.data.params["num_boost_round"] == "4"
    assert run.data.tags["own_tag"] == "tag-3"
    assert run.data.tags["mlflow.runName"] == run.data.tags["paiexp.job_name"]
    own = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "own_metric"))
    assert own == [(step, 3 + step / 10) for step in range(6)]
    (model,) = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
    )
    assert "paiexp.job_model_id" not in model.tags  # MLflow's own, made by the job itself
    log = project / ".paiexp" / "logs" / f"{run.info.run_name}.log"
    assert "token=given" in log.read_text()
    jobs = place.jobs or project / ".paiexp"
    assert not list(jobs.glob("**/paiexp_mlflow/mlruns")), "the job used a store of its own"
    written = [p for p in project.rglob("*") if p.is_file()]  # by paiexp (PAI keeps its own)
    assert not [p for p in written if TOKEN.encode() in p.read_bytes()]
    spec = client.download_artifacts(run_id, "job/spec.json", str(project / "fetched"))
    assert TOKEN not in Path(spec).read_text()
