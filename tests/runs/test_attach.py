"""A launcher killed with SIGKILL leaves its job running; `paiexp attach` finishes the run.

Each job prints its first steps, then waits for its gate (``$GATE``, a file the test makes)
before it goes on: it runs when its launcher is killed, by construction.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import all_runs, clean_env, mlflow_client, run_paiexp, wait_until

from paiexp.util.jsonfiles import read_json
from paiexp.util.processes import process_alive

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

HOLD = 'while [ ! -e "$GATE" ]; do sleep 0.05; done'  # the job waits for the test here
COMMAND = (
    'job.command=\'for i in 0 1 2 3 4 5; do echo "[$i] validation-logloss:0.$i"; done; '
    f"{HOLD}; echo test-auc=0.9; echo weights > $PAI_OUTPUT_MODEL/model.bin'"
)


def wait_for_running_job(project: Path, timeout: float = 120) -> Path:
    def started() -> Path | None:
        for job_dir in (project / ".paiexp" / "jobs").glob("xgb-*"):
            log = job_dir / "job.log"
            if log.exists() and "[1] validation" in log.read_text():
                return job_dir
        return None

    return wait_until(started, timeout, "a job printing its second step")


def start_launcher(project: Path, command: str) -> subprocess.Popen[bytes]:
    """``paiexp -q`` running the job ``command`` sets, in the background, its output dropped;
    its job's gate is ``project``/gate."""
    return subprocess.Popen(
        [sys.executable, "-m", "paiexp", "-q", command],
        cwd=project,
        env=clean_env(GATE=str(project / "gate")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_job_outlives_a_killed_launcher_and_attach_tracks_its_end(project: Path) -> None:
    launcher = start_launcher(project, COMMAND)
    job_dir = wait_for_running_job(project)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()

    launch = read_json(job_dir / "state.json")
    assert process_alive(launch["runner_pid"], launch["runner_start"])
    assert read_json(job_dir / "state.json")["state"] == "RUNNING"
    (run,) = all_runs(project)
    assert run.info.status == "RUNNING"

    # attach follows the job, held, from its log's start; then the job goes on to its end
    output = project / "attach.txt"
    with open(output, "w") as stream:
        attach = subprocess.Popen(
            [sys.executable, "-m", "paiexp", "attach", job_dir.name],
            cwd=project,
            env=clean_env(PYTHONUNBUFFERED="1"),
            stdout=stream,
            stderr=subprocess.PIPE,
            text=True,
        )
    wait_until(lambda: "[5] validation" in output.read_text(), 120, "attach to follow the job")
    (project / "gate").touch()
    _, stderr = attach.communicate(timeout=120)
    assert attach.returncode == 0, stderr
    assert "SUCCEEDED" in stderr
    assert output.read_text().splitlines()[1] == "[0] validation-logloss:0.0"  # whole log

    client = mlflow_client(project)
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test-auc"] == 0.9
    history = client.get_metric_history(run.info.run_id, "validation-logloss")
    assert sorted((m.step, m.value) for m in history) == [(i, i / 10) for i in range(6)]
    assert run.data.tags["paiexp.model_uri"].endswith("/ml/output/model")

    again = run_paiexp(project, "attach", job_dir.name)
    assert again.returncode == 0 and "already FINISHED" in again.stderr
    assert len(client.get_metric_history(run.info.run_id, "validation-logloss")) == 6


def test_attach_to_an_unknown_job_is_a_user_error(project: Path) -> None:
    run_paiexp(project, "-q", "job.command=true")
    result = run_paiexp(project, "attach", "no-such-job")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("paiexp: error: no MLflow run")


def test_attach_does_not_log_again_what_the_dead_launcher_flushed(project: Path) -> None:
    steps = 'for i in $(seq {} {}); do echo "[$i] validation-logloss:0.$i"; done'
    command = (
        f"job.command='{steps.format(0, 7)}; {HOLD}; {steps.format(8, 15)}; echo test-auc=0.8'"
    )
    launcher = start_launcher(project, command)
    wait_for_running_job(project)
    client = mlflow_client(project)

    def flushed_steps() -> list | None:
        """The steps the launcher's periodic flush has put in the run so far."""
        runs = all_runs(project)
        if not runs:
            return None
        return client.get_metric_history(runs[0].info.run_id, "validation-logloss") or None

    wait_until(flushed_steps, 60, "the launcher flushing metrics", interval=0.2)
    runs = all_runs(project)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    flushed = {m.step for m in flushed_steps() or []}
    assert flushed and flushed <= set(range(8))  # held at its gate: steps 8 to 15 to come

    (project / "gate").touch()
    job_name = runs[0].data.tags["paiexp.job_name"]
    result = run_paiexp(project, "attach", job_name, "-q")
    assert result.returncode == 0, result.stderr
    history = client.get_metric_history(runs[0].info.run_id, "validation-logloss")
    assert sorted(m.step for m in history) == list(range(16))  # each step exactly once
