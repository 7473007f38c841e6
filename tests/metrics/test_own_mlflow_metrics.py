"""A job's own MLflow metrics (``mlflow.log_metric`` in its script) as metrics while it runs: its
sweep's objective and pruning signal, and curves in its trial's run before it ends, each point
once after the end's merge, on every backend.

The reader is checked against MLflow's own reader of the store it reads (the file store the
job's calls write, made here by MLflow's client).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, mlflow_client, run_paiexp, wait_until
from gates import Gates, cleaned_up
from sweep_helpers import (
    children_by_trial,
    load_study,
    sweep_third_trial_pruned,
    synthetic_project,
)
from test_docker_backend import ChannelGates
from test_live_curves import backend_for, trial_run

from paiexp.contract.job_mlflow import watched
from paiexp.metrics.own_mlflow import OwnMetricReader

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

# The synthetic job with hyperparameter mlflow=true prints no metric: in a run of its own it
# logs `loss` and `accuracy` per step, and `score` at its end, with mlflow.log_metric.
OWN_METRICS_JOB = {"metric_definitions": [], "mlflow_metrics": ["score", "loss"]}
STEPS = 5


@pytest.fixture
def file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path]:
    """An MLflow client on a file store, as a job's own calls make it, and the store."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    return MlflowClient(store.as_uri()), store


def history(client: Any, run_id: str, key: str) -> list[tuple[int, int, float]]:
    return [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]


def read(points: list[Any], name: str) -> list[tuple[int, int, float]]:
    return [(p.step, round(p.timestamp * 1000), p.value) for p in points if p.name == name]


# -- the reader --------------------------------------------------------------------------------


def test_points_are_read_as_the_store_grows_each_once_as_mlflow_reads_them(
    file_store: tuple[Any, Path],
) -> None:
    """Two runs, a nested key and a NaN: each read returns what is new, and the points are
    MLflow's own reading of the same files (step, time in ms, value)."""
    client, store = file_store
    experiment = client.create_experiment("job")
    first, second = (client.create_run(experiment).info.run_id for _ in range(2))
    reader = OwnMetricReader(["val/loss"], taken=["loss"])
    assert reader.read(store / "missing") == []
    for step in range(3):
        client.log_metric(first, "val/loss", 1.0 / (step + 1), step=step)
    client.log_metric(first, "loss", 9.0)  # a log definition's name: not this reader's
    earlier = reader.read(store)
    assert read(earlier, "val/loss") == history(client, first, "val/loss")
    assert reader.read(store) == []  # nothing new
    client.log_metric(first, "val/loss", 0.1, step=3)
    client.log_metric(second, "acc", float("nan"), step=0)
    later = reader.read(store)
    assert read(later, "val/loss") == history(client, first, "val/loss")[3:]
    assert sorted(p.name for p in later) == ["acc", "val/loss"]
    assert len(reader.series["val/loss"]) == 4 and "loss" not in reader.series
    assert reader.keys == {"val/loss", "loss", "acc"}


def test_a_line_being_written_is_read_once_its_end_is_there(
    file_store: tuple[Any, Path],
) -> None:
    client, store = file_store
    run_id = client.create_run(client.create_experiment("job")).info.run_id
    client.log_metric(run_id, "loss", 0.5, timestamp=1000, step=0)
    (path,) = store.glob(f"*/{run_id}/metrics/loss")
    reader = OwnMetricReader([])
    assert len(reader.read(store)) == 1
    with path.open("a") as stream:
        stream.write("2000 0.25")  # its step not written yet
        stream.flush()
        assert reader.read(store) == []
        stream.write(" 1\n")
    (point,) = reader.read(store)
    assert (point.step, point.value, point.timestamp) == (1, 0.25, 2.0)
    assert read(reader.series["loss"], "loss") == history(client, run_id, "loss")


def test_the_final_value_is_mlflows_latest_and_a_declared_metric_never_logged_says_so(
    file_store: tuple[Any, Path],
) -> None:
    """MLflow's latest is the highest step's (here logged before a lower step's)."""
    client, store = file_store
    run_id = client.create_run(client.create_experiment("job")).info.run_id
    client.log_metric(run_id, "score", 3.0, timestamp=1000, step=5)
    client.log_metric(run_id, "score", 7.0, timestamp=2000, step=2)
    reader = OwnMetricReader(["score", "val_loss"])
    reader.read(store)
    assert reader.final() == {"score": 3.0} == client.get_run(run_id).data.metrics
    assert reader.missing() == {
        "val_loss": "the job's own MLflow calls never logged metric 'val_loss'; they logged: score"
    }


def test_a_remote_stores_copy_holds_its_metric_files_and_which_models_it_logged() -> None:
    """On PAI the store is copied as it grows: its metric files and its logged models' meta.yaml
    (that it logged one), not artifacts nor models' files."""
    assert watched("0/4f2a/metrics/loss") and watched("0/4f2a/metrics/val/loss")
    assert watched("0/models/m-1/meta.yaml")
    assert not watched("0/4f2a/artifacts/model/model.xgb")
    assert not watched("0/4f2a/meta.yaml") and not watched("0/meta.yaml")
    assert not watched("0/models/m-1/metrics/loss") and not watched("0/models/m-1/artifacts/x")
    assert not watched(".trash/4f2a/metrics/loss")


# -- sweeps ------------------------------------------------------------------------------------


@contextmanager
def own_metrics_backend(
    name: str, root: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Gates, list[str], dict[str, str]]]:
    """``backend_for``'s, but docker's jobs in the test image with MLflow."""
    if name == "docker":
        image = request.getfixturevalue("mlflow_image")
        gates = ChannelGates(root / ".paiexp" / "docker")
        yield gates, ["backend=docker", f"backend.image={image}"], clean_env()
    else:
        with backend_for(name, root, request) as found:
            yield found


def losses(client: Any, run_id: str) -> list[tuple[int, float]]:
    """The run's loss points, (step, value), each as often as MLflow holds it."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))


def assert_logged(points: list[tuple[int, float]], x: float, steps: int) -> None:
    """``points`` are the loss points the synthetic job logs in its first ``steps`` steps,
    each once."""
    assert [step for step, _ in points] == list(range(steps))
    assert [value for _, value in points] == pytest.approx(
        [x * x + 1.0 / (step + 1) for step in range(steps)]
    )


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("local"),
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("pai", marks=pytest.mark.slow),
    ],
)
def test_a_sweep_is_judged_and_pruned_on_its_jobs_own_mlflow_metrics(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Objective `score` and the median pruner's `loss` come from the jobs' own MLflow calls
    only; the third trial (far worse) is pruned while held, and each run holds each point its
    job logged once (read while it ran, then merged from its store)."""
    with own_metrics_backend(backend, tmp_path, request) as (gates, overrides, env):
        study = sweep_third_trial_pruned(
            tmp_path, gates, overrides, env, OWN_METRICS_JOB, duration=0.1, steps=STEPS, mlflow=True
        )
    client = mlflow_client(tmp_path)
    for number, child in children_by_trial(tmp_path).items():
        x = study.trials[int(number)].params["x"]
        points = losses(client, child.info.run_id)
        if number == "2":  # stopped: the points it logged before
            assert_logged(points, x, len(points))
        else:
            assert_logged(points, x, STEPS)
            assert child.data.metrics["score"] == pytest.approx(x * x)


@pytest.mark.parametrize(
    "backend", [pytest.param("local"), pytest.param("docker", marks=pytest.mark.docker)]
)
def test_a_running_trials_own_mlflow_points_are_in_its_run_before_it_ends(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    sweep = {"params": {"x": "interval(-1, 1)"}, "n_trials": 1, "parallelism": 1}
    with own_metrics_backend(backend, tmp_path, request) as (gates, overrides, env):
        job = {
            **OWN_METRICS_JOB,
            "hyperparameters": {"duration": 0.1, "steps": STEPS, "mlflow": True},
            "environments": gates.env(),
        }
        root = synthetic_project(tmp_path, sweep, job)
        output = tmp_path / "launcher.txt"
        with output.open("w") as stream:
            launcher = subprocess.Popen(
                [sys.executable, "-m", "paiexp", "+sweep=syn", *overrides],
                cwd=root,
                env=env,
                stdout=stream,
                stderr=subprocess.STDOUT,
            )
        with cleaned_up(gates, [launcher]):
            (job_gate,) = gates.wait_held(1)  # its points logged, its job running
            run_id = trial_run(root).info.run_id
            client = mlflow_client(root)
            x = load_study(root).trials[0].params["x"]
            live = wait_until(
                lambda: (held := losses(client, run_id)) and len(held) >= STEPS and held,
                120,
                f"{STEPS} loss points in the running trial's run",
                interval=0.5,
            )
            assert gates.held() == [job_gate] and launcher.poll() is None  # still held
            assert client.get_run(run_id).info.status == "RUNNING"
            assert_logged(live, x, STEPS)
            gates.open([job_gate])
            code = launcher.wait(timeout=180)
    assert code == 0, output.read_text()
    assert client.get_run(run_id).info.status == "FINISHED"
    assert_logged(losses(client, run_id), x, STEPS)  # each point once
    assert client.get_run(run_id).data.metrics["score"] == pytest.approx(x * x)


def test_a_declared_metric_never_logged_is_one_warning_and_fails_the_trial_judged_on_it(
    tmp_path: Path,
) -> None:
    """A single run says which metrics the job did log; a sweep's trial judged on the metric
    fails, saying the same."""
    job = {
        **OWN_METRICS_JOB,
        "mlflow_metrics": [*OWN_METRICS_JOB["mlflow_metrics"], "val_loss"],
        "hyperparameters": {"x": 0.5, "duration": 0.1, "steps": 3, "mlflow": True, "model": True},
    }
    sweep = {"params": {"x": "interval(-1, 1)"}, "n_trials": 1, "parallelism": 1}
    root = synthetic_project(tmp_path, sweep, job)
    why = "the job's own MLflow calls never logged metric 'val_loss'; they logged: accuracy, loss"
    done = run_paiexp(root, "-q")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].endswith(f"MLflow metric 'val_loss': {why}, score")
    swept = run_paiexp(root, "+sweep=syn", "sweep.objective.metric=val_loss")
    assert swept.returncode != 0
    (trial,) = load_study(root).trials
    assert trial.state.name == "FAIL"
    assert f"objective metric 'val_loss': {why}, score" in swept.stdout + swept.stderr


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "said"),
    [
        (
            {"mlflow_metrics": ["loss"]},  # the synthetic job's log definitions have loss
            "paiexp: error: job.mlflow_metrics[0]: metric name 'loss' is a "
            "job.metric_definitions or job.tensorboard.metrics name too; a metric has one source",
        ),
        (
            {"metric_definitions": [], "mlflow_metrics": ["score", "score"]},
            "paiexp: error: job.mlflow_metrics[1]: 'score' is declared twice",
        ),
        (
            {"metric_definitions": [], "mlflow_metrics": ["val loss!"]},
            "paiexp: error: job.mlflow_metrics[0]: invalid value 'val loss!'; expected an MLflow "
            "metric key of letters, digits, '_', '-', '.', '/' and spaces (e.g. val_loss)",
        ),
        (
            {"metric_definitions": [], "mlflow_metrics": ["loss"]},
            "paiexp: error: sweep.objective.metric: 'score' is not a metric the job declares; "
            "job.metric_definitions, job.tensorboard.metrics and job.mlflow_metrics have: loss",
        ),
    ],
)
def test_bad_mlflow_metrics_are_one_line_and_nothing_runs(
    tmp_path: Path, job: dict[str, Any], said: str
) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(-1, 1)"}, "n_trials": 1}, job)
    result = run_paiexp(root, "+sweep=syn")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [said]
    assert not (root / "optuna.journal").exists() and not (root / ".paiexp" / "jobs").exists()
