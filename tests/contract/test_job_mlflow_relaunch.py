"""A launcher SIGKILLed while a job's own MLflow calls are being merged into its run, then
relaunched (``paiexp attach``, the same sweep again): everything lands once, nothing twice.

Each job holds at its gate (``$GATE-<max_depth>``) after logging its params, model and first
three points: it runs when its launcher is killed, by construction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import all_runs, clean_env, mlflow_client, run_paiexp, wait_until
from job_mlflow_helpers import JOB, check_run, write_project

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command


@pytest.fixture
def project(project: Path) -> Iterator[Path]:
    """The project, whose jobs' gates are all opened at the end, whatever happened."""
    yield project
    for depth in (2, 3, 4):
        (project / f"gate-{depth}").touch()


def launch(project: Path, *args: str) -> subprocess.Popen[bytes]:
    """``paiexp -q job=own ARGS`` in the background, its jobs' gates under ``project``."""
    return subprocess.Popen(
        [sys.executable, "-m", "paiexp", "-q", f"job={JOB}", *args],
        cwd=project,
        env=clean_env(GATE=str(project / "gate")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def held(project: Path, count: int) -> None:
    """Wait until ``count`` jobs wait at their gates."""

    def holding() -> bool:
        logs = project.glob(".paiexp/jobs/*/job.log")
        return sum("held" in log.read_text() for log in logs) == count

    wait_until(holding, 120, f"{count} jobs at their gates")


def merged_models(project: Path, run_id: str) -> list:
    client = mlflow_client(project)
    (run,) = [run for run in all_runs(project) if run.info.run_id == run_id]
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
    )
    return [m for m in models if "paiexp.job_model_id" in m.tags]


def kill(launcher: subprocess.Popen[bytes]) -> None:
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()


def test_attach_after_a_killed_launcher_merges_nothing_twice(project: Path) -> None:
    write_project(project)
    launcher = launch(project)
    held(project, 1)
    (run,) = wait_until(lambda: all_runs(project), 60, "the job's run")
    run_id = run.info.run_id
    client = mlflow_client(project)

    def merged_so_far() -> bool:  # the launcher merges the store as the job runs
        points = client.get_metric_history(run_id, "own_metric")
        return len(points) == 3 and len(merged_models(project, run_id)) == 1

    wait_until(merged_so_far, 60, "the launcher merging the job's first points and model")
    kill(launcher)
    assert client.get_run(run_id).info.status == "RUNNING"

    (project / "gate-3").touch()
    attach = run_paiexp(project, "attach", run.data.tags["paiexp.job_name"])
    assert attach.returncode == 0, attach.stderr
    (run,) = all_runs(project)
    assert run.info.status == "FINISHED"
    check_run(client, run, depth=3)  # one model, each point once


def test_a_relaunched_sweep_merges_each_trial_once(project: Path) -> None:
    write_project(project)
    (project / "gate-2").touch()  # trial 0 runs through; trial 1 is held
    grid = ["-m", "job.hyperparameters.max_depth=2,4", "sweep.study_name=own"]
    launcher = launch(project, *grid)
    held(project, 2)  # trial 0 passed its gate, trial 1 waits at it
    client = mlflow_client(project)

    def first_trial_closed() -> str | None:
        for run in all_runs(project):
            done = run.info.status == "FINISHED" and run.data.params.get("max_depth") == "2"
            if (
                done
                and "mlflow.parentRunId" in run.data.tags
                and merged_models(project, run.info.run_id)
            ):
                return str(run.info.run_id)
        return None

    first = wait_until(first_trial_closed, 120, "trial 0's run, merged and closed")
    kill(launcher)

    relaunched = launch(project, *grid)
    (project / "gate-4").touch()
    assert relaunched.wait(timeout=240) == 0
    runs = all_runs(project)
    assert len(runs) == 3  # the parent run and one run per trial: none made twice
    trials = {
        int(r.data.params["max_depth"]): r for r in runs if "mlflow.parentRunId" in r.data.tags
    }
    assert trials[2].info.run_id == first
    for depth, run in trials.items():
        assert run.info.status == "FINISHED"
        check_run(client, run, depth)
