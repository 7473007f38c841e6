"""Curves while a sweep's trials run (#35): a running trial's points are in its MLflow run
before its job ends, each once, on every backend; and so after its tracking process died with
points it had not logged.

Each trial's job prints its points and is then held at its gate (tests/gates.py): it is
running, asserted so, while its run is read; only the test lets it end.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, mlflow_client, wait_until
from emulator import Emulator
from gates import Gates, cleaned_up
from sweep_helpers import load_study, synthetic_project
from test_docker_backend import ChannelGates
from test_helper_deaths import runs_by_status, tracking_process_of
from test_openpai_backend import STORAGE, cluster_for, openpai_env, openpai_overrides
from test_pai_backend import pai_env, pai_overrides

from paiexp.sweep.records import JOB_NAME
from paiexp.tracking.monitor import job_log
from paiexp.util.processes import process_stat

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

STEPS = 4


class StorageGates(Gates):
    """Gates in an OpenPAI cluster's storage, which its jobs' containers mount."""

    def env(self) -> dict[str, str]:
        return {"GATES": f"/mnt/{STORAGE}/gates"}


@contextmanager
def backend_for(
    name: str, root: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Gates, list[str], dict[str, str]]]:
    """A backend's gates, the sweep's overrides and environment for it: the local one; docker
    (the jobs' gates in their own channel); the PAI emulator (the jobs as host processes); a
    fake OpenPAI cluster (the jobs in containers, their gates in its storage)."""
    if name == "docker":
        image = request.getfixturevalue("docker_image")
        gates = ChannelGates(root / ".paiexp" / "docker")
        yield gates, ["backend=docker", f"backend.image={image}"], clean_env()
    elif name == "openpai":
        image = request.getfixturevalue("docker_image")
        cluster = cluster_for(request)
        gates = StorageGates(cluster.storage_dir(STORAGE) / "gates")
        yield gates, openpai_overrides(cluster, image), openpai_env(cluster)
    elif name == "pai":
        with Emulator(root / "cloud") as cloud:
            yield Gates(root / "gates"), pai_overrides(cloud), pai_env(cloud)
    else:
        yield Gates(root / "gates"), [], clean_env()


def sweep(root: Path, overrides: list[str], env: dict[str, str], output: Path) -> Any:
    """``paiexp +sweep=syn`` in ``root``, what it says written to ``output``."""
    with open(output, "w") as stream:
        return subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+sweep=syn", *overrides],
            cwd=root,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )


def one_trial(root: Path, gates: Gates, **hyperparameters: Any) -> Path:
    """A sweep of one trial whose job prints its loss points and is held at its gate."""
    return synthetic_project(
        root,
        {"params": {"x": "interval(-1, 1)"}, "n_trials": 1, "parallelism": 1},
        {
            "hyperparameters": {"x": 0.0, "duration": 0.1, "steps": STEPS, **hyperparameters},
            "environments": gates.env(),
        },
    )


def trial_run(root: Path) -> Any:
    """The trial's run, once the tracking process has made it (read only until then: the
    store is the sweep's to create)."""
    wait_until(lambda: runs_by_status(root).get("RUNNING") == 2, 120, "the trial's run made")
    (child,) = [
        run
        for run in mlflow_client(root).search_runs(
            [e.experiment_id for e in mlflow_client(root).search_experiments()]
        )
        if "mlflow.parentRunId" in run.data.tags
    ]
    return child


def losses(root: Path, run_id: str) -> list[tuple[int, float]]:
    """The run's loss points, (step, value), each as often as MLflow holds it."""
    return sorted((m.step, m.value) for m in mlflow_client(root).get_metric_history(run_id, "loss"))


def printed(root: Path, steps: int) -> list[tuple[int, float]]:
    """The loss points the trial's job printed in its first ``steps`` steps."""
    x = load_study(root).trials[0].params["x"]
    return [(step, round(x * x + 1.0 / (step + 1), 6)) for step in range(steps)]


def holding(root: Path, run_id: str, count: int) -> list[tuple[int, float]]:
    """The run's loss points once it holds ``count`` (or more) of them."""
    return wait_until(
        lambda: (held := losses(root, run_id)) and len(held) >= count and held,
        120,
        f"{count} loss points in the running trial's run",
        interval=0.5,
    )


def status(root: Path, run_id: str) -> str:
    return str(mlflow_client(root).get_run(run_id).info.status)


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("local"),
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("pai", marks=pytest.mark.slow),
        pytest.param("openpai", marks=pytest.mark.docker),
    ],
)
def test_a_running_trials_points_are_in_its_run_before_its_job_ends(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with backend_for(backend, tmp_path, request) as (gates, overrides, env):
        root = one_trial(tmp_path, gates)
        launcher = sweep(root, overrides, env, tmp_path / "launcher.txt")
        with cleaned_up(gates, [launcher]):
            (job,) = gates.wait_held(1)  # its points printed, its job running
            run = trial_run(root)
            live = holding(root, run.info.run_id, STEPS)
            assert gates.held() == [job] and launcher.poll() is None  # still held
            assert status(root, run.info.run_id) == "RUNNING"
            assert live == printed(root, STEPS)
            gates.open([job])
            code = launcher.wait(timeout=180)
        said = (tmp_path / "launcher.txt").read_text()
        assert code == 0, said
        assert status(root, run.info.run_id) == "FINISHED"
        assert losses(root, run.info.run_id) == printed(root, STEPS)  # each point once
        assert "score" in mlflow_client(root).get_run(run.info.run_id).data.metrics


def test_points_a_killed_tracking_process_never_logged_are_logged_once(tmp_path: Path) -> None:
    """The job is held after every two points.  Its first two are in its run; then its
    tracking process is stopped, the job prints two more that the launcher reads and sends
    (the launcher reads two more after that, so the call was surely sent), and the stopped
    process is killed: the new one logs the points it never did, while the job is held, each
    once, and the run ends whole."""
    gates = Gates(tmp_path / "gates")
    root = one_trial(tmp_path, gates, steps=6, hold_every=2)
    output = tmp_path / "launcher.txt"
    launcher = sweep(root, [], clean_env(), output)
    with cleaned_up(gates, [launcher]):
        first = gates.wait_held(1)  # two points printed
        run_id = trial_run(root).info.run_id
        assert holding(root, run_id, 2) == printed(root, 2)
        tracking = tracking_process_of(launcher.pid)
        assert tracking is not None
        subprocess.run(["kill", "-STOP", str(tracking)], check=True)
        wait_until(lambda: (process_stat(tracking) or ["?"])[0] == "T", 60, "it to stop")

        job = load_study(root).trials[0].user_attrs[JOB_NAME]

        def read(count: int) -> bool:
            """Whether the launcher has read ``count`` loss lines of the job's log (its copy)."""
            return job_log(root, job).read_text().count("loss=") == count

        gates.open(first)
        second = gates.wait_held(1)  # four printed
        wait_until(lambda: read(4), 120, "the launcher to read four points")
        gates.open(second)
        last = gates.wait_held(1)  # six printed: the call with points 2 and 3 was sent before
        wait_until(lambda: read(6), 120, "the launcher to read six points")
        assert losses(root, run_id) == printed(root, 2), "the stopped process logged points"
        subprocess.run(["kill", "-KILL", str(tracking)], check=True)

        assert holding(root, run_id, 6) == printed(root, 6)  # each once, the job held
        assert gates.held() == last and status(root, run_id) == "RUNNING"
        gates.open(last)
        code = launcher.wait(timeout=180)
    said = output.read_text()
    assert code == 0, said
    deaths = re.findall(
        r"tracking process died \(killed by SIGKILL\); a new one applies the (\d+)", said
    )
    assert len(deaths) == 1 and int(deaths[0]) >= 1, said  # the call it never did, at least
    assert status(root, run_id) == "FINISHED"
    assert losses(root, run_id) == printed(root, 6)
