"""A project with a synthetic job and sweep, for launcher tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from conftest import REPO, wait_until
from gates import Gates, cleaned_up

from paiexp.util.jsonfiles import read_json

JOB = {
    "name": "synthetic",
    "command": "python job.py",
    "source_dir": "synthetic",
    "hyperparameters": {"x": 0.0, "duration": 0.5, "steps": 5},
    "metric_definitions": [
        {"name": "loss", "regex": r"loss=([-+0-9.eE]+|nan)"},
        {"name": "score", "regex": r"score=([-+0-9.eE]+|nan)"},
    ],
}

MEDIAN_PRUNER = {  # after two complete trials, stops one whose loss is above their median
    "name": "median",
    "metric": "loss",
    "direction": "minimize",  # the loss falls as a good trial goes on
    "options": {"n_startup_trials": 2, "n_warmup_steps": 1},
}


def third_trial_pruned(params: dict[str, Any], worst_x: float = 2.9) -> dict[str, Any]:
    """A sweep of three trials, one at a time, whose third (x = ``worst_x``, the first two
    near 0) the median pruner stops."""
    return {
        "params": params,
        "n_trials": 3,
        "parallelism": 1,
        "sampler": {"name": "random", "seed": 0},
        "pruner": MEDIAN_PRUNER,
        "enqueue": [{"x": 0.0}, {"x": 0.1}, {"x": worst_x}],
    }


def sweep_third_trial_pruned(
    root: Path,
    gates: Gates,
    overrides: list[str],
    env: dict[str, str],
    job: dict[str, Any],
    **params: Any,
) -> Any:
    """The synthetic job (``job`` over its settings, its gates ``gates``) swept in ``root`` as
    :func:`third_trial_pruned` with ``params`` (``steps`` among them), each of the first two
    trials let end once its steps are reported; returns the study, asserted to be pruned so."""
    import pytest

    project = synthetic_project(
        root,
        third_trial_pruned({"x": "interval(-3, 3)", **params}),
        {**job, "environments": gates.env()},
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn", *overrides],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with cleaned_up(gates, [launcher]):
        let_end_once_reported(gates, project, params["steps"])
        _, err = launcher.communicate(timeout=180)  # the third is held: only a stop ends it
    assert launcher.returncode == 0, err
    study = load_study(project)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert study.trials[0].value == 0.0
    assert study.trials[1].value == pytest.approx(0.01)
    assert len(study.trials[2].intermediate_values) >= 2  # pruned past its warm-up step
    return study


def children_by_trial(root: Path) -> dict[str, Any]:
    """The project's trial runs by trial number (the tag, a string)."""
    _, children = sweep_runs(root)
    return {c.data.tags["paiexp.trial_number"]: c for c in children}


def synthetic_project(root: Path, sweep: dict[str, Any], job: dict[str, Any] | None = None) -> Path:
    shutil.copytree(REPO / "conf", root / "conf")
    shutil.copytree(REPO / "tests" / "synthetic", root / "synthetic")
    (root / "conf" / "job" / "synthetic.yaml").write_text(yaml.safe_dump({**JOB, **(job or {})}))
    config = yaml.safe_load((root / "conf" / "config.yaml").read_text())
    config["defaults"] = [
        "paiexp_schema",
        {"job": "synthetic"},
        {"backend": "local"},
        {"tracker": "mlflow"},
        "_self_",
    ]
    (root / "conf" / "config.yaml").write_text(yaml.safe_dump(config))
    (root / "sweeps").mkdir()
    base = {"objective": {"metric": "score", "direction": "minimize"}, "parallelism": 2}
    (root / "sweeps" / "syn.yaml").write_text(yaml.safe_dump({"sweep": {**base, **sweep}}))
    return root


def load_study(root: Path, name: str = "syn") -> Any:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(root / "optuna.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def sweep_runs(root: Path) -> tuple[list[Any], list[Any]]:
    """(parent runs, child runs) in the project's mlflow.db."""
    from conftest import all_runs

    runs = all_runs(root)
    parents = [r for r in runs if r.data.tags.get("paiexp.kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def jobs_dir(root: Path) -> Path:
    """Where backend=local keeps a project's jobs."""
    return root / ".paiexp" / "jobs"


def running_jobs(root: Path) -> list[Path]:
    """The local jobs whose runners run now."""
    if not jobs_dir(root).exists():
        return []
    states = {d: read_json(d / "state.json") for d in jobs_dir(root).iterdir()}
    return [d for d, s in states.items() if s and s["state"] == "RUNNING" and "pgid" in s]


def counted_trials(trials: list[Any], at_most: int = 1) -> list[Any]:
    """The trials that count: all but those (``at_most``, one per launcher ended) a launcher
    ended (killed, or cut off from the study's database) while asking for it, some of its
    parameters written: resume fails such a trial without running it, and it counts no more
    (its point is asked for anew)."""
    from paiexp.sweep.records import JOB_NAME, REASON, RETRIED

    never_ran = [t for t in trials if t.user_attrs.get(RETRIED) and JOB_NAME not in t.user_attrs]
    for trial in never_ran:
        assert trial.state.name == "FAIL", trial
        assert "ended while asking for it, before it had a job" in trial.user_attrs[REASON]
    assert len(never_ran) <= at_most, never_ran
    return [t for t in trials if t not in never_ran]


def let_end_once_reported(gates: Gates, root: Path, steps: int, numbers: int = 2) -> None:
    """Let the first ``numbers`` trials' held jobs end one at a time, each once its ``steps``
    are reported to the study (what the pruner measures the next trial against)."""
    for number in range(numbers):
        (job,) = gates.wait_held(1)
        wait_until(
            lambda n=number: len(load_study(root).trials[n].intermediate_values) == steps,
            120,
            f"trial {number}'s steps to be reported",
        )
        gates.open([job])
