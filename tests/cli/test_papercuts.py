"""What a new user met in a fresh clone (issue 14), each fixed: the README says to activate
the environment; ``--help`` lists the subcommands; a missing ``[pai]`` extra is one line for
``paiexp images`` too; a sweep's summary suggests only tools that are there, by a path that
works outside the environment, and prints its best parameters as ``key=value``; its status
line counts pruned trials as done; its child runs carry ``paiexp.job_id``; with ``-q`` a
failed job prints no ``model:`` line; ``paiexp download`` reads a local store's run without
MLflow, and reads what MLflow's client reads.  (``rerun`` without arguments and ``sweep=``
without ``+``: tests/cli/test_bad_input.py and tests/sweep/test_sweep_bad_input.py; the latency:
benchmarks/cli_latency.py.)"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    REPO,
    all_runs,
    assert_nothing_started,
    assert_one_line_error,
    clean_env,
    run_paiexp,
)
from gates import Gates, cleaned_up
from rich.console import Console
from sweep_helpers import (
    let_end_once_reported,
    load_study,
    sweep_runs,
    synthetic_project,
    third_trial_pruned,
)

from paiexp.cli import COMMANDS
from paiexp.commands.download import MlflowRuns, SqliteRuns, sqlite_file
from paiexp.config.compose import compose, locate_project, to_object
from paiexp.sweep.progress import Progress, TrialCounts, status_line
from paiexp.sweep.study import Objective
from paiexp.tracking.mlflow_tracker import tracking_uri

OUTSIDE_THE_VENV = "/usr/local/bin:/usr/bin:/bin"  # PATH without the environment's bin/


def test_using_it_says_to_activate_the_environment() -> None:
    readme = (REPO / "README.md").read_text()
    using = readme.split("## Using it", 1)[1].split("\n## ", 1)[0]
    activate = using.index("source .venv/bin/activate")
    assert activate < using.index("python -m paiexp")


def test_help_lists_every_subcommand(tmp_path: Path) -> None:
    done = run_paiexp(tmp_path, "--help", timeout=60)
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^\s+paiexp (\w+)", done.stdout, flags=re.MULTILINE)
    assert set(COMMANDS) <= set(listed), done.stdout
    for flag in ("--multirun", "--info", "--config-path", "--config-dir"):
        assert flag in done.stdout
    rerun = run_paiexp(tmp_path, "rerun", "--help", timeout=60)
    assert "RUN_ID [KEY=VALUE ...]" in rerun.stdout


def test_images_without_the_pai_extra_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker" / "alibabacloud_credentials"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = clean_env(PYTHONPATH=str(tmp_path / "blocker"))
    line = assert_one_line_error(run_paiexp(tmp_path, "images", env=env, timeout=60))
    assert "alibabacloud_credentials" in line
    assert line.endswith("pip install 'paiexp[pai]'")
    assert_nothing_started(tmp_path)


def test_the_status_line_counts_pruned_and_failed_trials_as_done() -> None:
    progress = Progress(30, [Objective("score", "minimize")], Console(file=io.StringIO()))
    for number, state in enumerate(["COMPLETE"] * 17 + ["PRUNED"] * 2 + ["FAIL"]):
        progress.finished(number, state, [1.0] if state == "COMPLETE" else None, None)
    progress.finished(20, "FAIL", None, "submission failed", retried=True)  # runs again
    status = progress.status().plain
    assert status.startswith("sweep 20/30 done (17 complete, 2 pruned, 1 failed) · ")
    assert "· 1 re-run ·" in status
    progress.finished(21, "FAIL", None, "reclaimed", retried=True, preempted=True)
    assert "· 2 re-run (1 preempted) ·" in progress.status().plain
    shown = progress.console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert shown[-2:] == ["trial   20 FAIL     submission failed", "trial   21 PREEMPTED reclaimed"]
    preempted_only = status_line(TrialCounts(complete=1, preempted=1), 2, "-", 1.0).plain
    assert "preempted" not in preempted_only  # only ever said of re-runs it is part of


@pytest.mark.slow
def test_a_sweeps_summary_and_runs(tmp_path: Path) -> None:
    steps = 5
    root = synthetic_project(
        tmp_path, third_trial_pruned({"x": "interval(-3, 3)", "duration": 0.2, "steps": steps})
    )
    gates = Gates(tmp_path / "gates")  # each job runs until the test opens its gate
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn"],
        cwd=root,
        env=clean_env(PATH=OUTSIDE_THE_VENV, **gates.env()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    with cleaned_up(gates, [launcher]):
        let_end_once_reported(gates, root, steps)
        _, out = launcher.communicate(timeout=120)  # the third job is held: only its stop ends it
        assert launcher.returncode == 0, out
        assert len(gates.opened()) == 2  # not the third: it was stopped before it could end

    assert "sweep 3/3 done (2 complete, 1 pruned) · " in out
    study = load_study(root)
    best = study.best_trial.params
    assert f"best params: x={best['x']:.6g}\n" in out  # key=value, not a Python dict
    command = re.search(r"browse runs:\s+(\S+) ui --backend-store-uri", out)
    assert command, out
    mlflow = command.group(1)  # runs from this PATH: the environment's own, by its path
    assert os.access(mlflow, os.X_OK) and Path(mlflow).is_absolute(), mlflow
    has_dashboard = importlib.util.find_spec("optuna_dashboard") is not None
    assert ("optuna-dashboard" in out) == has_dashboard

    [_parent], children = sweep_runs(root)
    job_ids = {str(t.number): t.user_attrs["paiexp:job_id"] for t in study.trials}
    assert {c.data.tags["paiexp.trial_number"]: c.data.tags["paiexp.job_id"] for c in children} == (
        job_ids
    )


@pytest.mark.slow
def test_a_failed_job_prints_no_model_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}})
    done = run_paiexp(
        root, "-q", "+job.hyperparameters.fail=true", "job.hyperparameters.duration=0.1"
    )
    assert done.returncode == 1, done.stderr
    assert re.search(r"job synthetic-\S+: FAILED", done.stderr), done.stderr
    assert "model:" not in done.stderr
    [run] = all_runs(root)
    assert run.data.tags["paiexp.output.model"]  # it had a model channel: not printed

    # paiexp download reads a local store's run without MLflow: the same run MLflow reads
    monkeypatch.chdir(root)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = to_object(compose(locate_project(), []))
    database = sqlite_file(tracking_uri(config.tracker.uri))
    assert database == root / "mlflow.db"
    direct, through_mlflow = (
        SqliteRuns(database).get(run.info.run_id),
        MlflowRuns(config).get(run.info.run_id),
    )
    assert direct is not None and through_mlflow is not None
    assert direct.tags == through_mlflow.tags == run.data.tags
    assert direct.config_text() == through_mlflow.config_text()
    assert SqliteRuns(database).get("0" * 32) is None
