"""The starter pipelines `paiexp init` ships, end to end on backend=local: pipelines/xgb.yaml
(search -> refit the best -> publish or fall back) and pipelines/workflow.yaml (PAI's
CustomJob workflow); running them again adds no job and no run; a launcher killed during the
refit leaves a pipeline that the same command completes, the refit's job run once."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import clean_env, run_paiexp, wait_until
from pipeline_helpers import (
    job_dirs,
    pipeline_runs,
    run_ids,
    starter_project,
    state,
    statuses,
)
from sweep_helpers import load_study

from paiexp.util.jsonfiles import read_json

pytestmark = pytest.mark.slow
SMALL_SEARCH = "pipeline.steps.search.overrides.sweep.n_trials=3"


def test_init_ships_the_pipelines(tmp_path: Path) -> None:
    made = run_paiexp(tmp_path, "init", "project")
    assert made.returncode == 0, made.stderr
    for part in (
        "pipelines/xgb.yaml",
        "pipelines/workflow.yaml",
        "conf/job/publish.yaml",
        "conf/job/workflow.yaml",
        "examples/xgb/publish.py",
        "examples/workflow/train.py",
    ):
        assert (tmp_path / "project" / part).is_file(), part


def test_xgb_pipeline_searches_refits_and_publishes(tmp_path: Path) -> None:
    root = starter_project(tmp_path)
    done = run_paiexp(root, "+pipeline=xgb", SMALL_SEARCH)
    assert done.returncode == 0, done.stderr
    assert statuses(root, "xgb") == {
        "search": "succeeded",
        "refit": "succeeded",
        "publish": "succeeded",
        "fallback": "skipped",
    }
    steps = state(root, "xgb")["steps"]
    study = load_study(root, steps["search"]["handle"])
    assert len(study.trials) == 3
    parent, runs, trials = pipeline_runs(root)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["paiexp.pipeline"] == "xgb"
    (search,), (refit,), (publish,), (fallback,) = (runs[s] for s in steps)
    # the sweep's trials are nested under its step's run
    assert search.data.tags["paiexp.kind"] == "sweep"
    assert len(trials) == 3
    assert {t.data.tags["mlflow.parentRunId"] for t in trials} == {search.info.run_id}
    # the refit ran the best trial's hyperparameters (fixed ones too)
    best = {name: str(value) for name, value in study.best_trial.params.items()}
    assert {name: refit.data.params[name] for name in best} == best
    assert refit.data.params["seed"] == "42"
    # publish was given the refit's model and scored it as the refit did
    model = refit.data.tags["paiexp.model_uri"]
    assert steps["publish"]["config"]["job"]["inputs"]["model"] == model
    assert publish.data.metrics["test-auc"] == refit.data.metrics["test-auc"] >= 0.97
    assert (
        Path(publish.data.tags["paiexp.model_uri"].removeprefix("file://")) / "model_card.json"
    ).is_file()
    assert fallback.data.tags["paiexp.step_status"] == "skipped"
    assert fallback.data.tags["paiexp.when"] == 'steps.refit.metrics["test-auc"] < 0.97'
    seen = refit.data.metrics["test-auc"]
    assert fallback.data.tags["paiexp.when_values"] == f'steps.refit.metrics["test-auc"] = {seen!r}'

    jobs, runs_before = job_dirs(root), run_ids(root)
    again = run_paiexp(root, "+pipeline=xgb", SMALL_SEARCH)
    assert again.returncode == 0, again.stderr
    assert job_dirs(root) == jobs
    assert run_ids(root) == runs_before
    assert len(load_study(root, steps["search"]["handle"]).trials) == 3


def test_workflow_pipeline_takes_the_branch_step_1_chose(tmp_path: Path) -> None:
    root = starter_project(tmp_path)
    done = run_paiexp(root, "+pipeline=workflow")
    assert done.returncode == 0, done.stderr
    assert statuses(root, "workflow") == {
        "train_step_1": "succeeded",
        "train_step_2": "skipped",
        "train_step_3": "succeeded",
    }
    _, runs, _ = pipeline_runs(root)
    (first,), (second,), (third,) = (
        runs[s] for s in ("train_step_1", "train_step_2", "train_step_3")
    )
    accuracy = first.data.metrics["test-accuracy"]  # an output parameter the script wrote
    assert accuracy > 0.90
    assert second.data.tags["paiexp.when_values"] == (
        f'steps.train_step_1.metrics["test-accuracy"] = {accuracy!r}'
    )
    assert third.data.params["n_estimators"] == "1000"
    assert third.data.metrics["test-accuracy"] > 0.90

    jobs, runs_before = job_dirs(root), run_ids(root)
    again = run_paiexp(root, "+pipeline=workflow")
    assert again.returncode == 0, again.stderr
    assert job_dirs(root) == jobs
    assert run_ids(root) == runs_before


@pytest.mark.timeout(420)
def test_launcher_killed_during_refit_then_same_command_completes_it_once(tmp_path: Path) -> None:
    root = starter_project(tmp_path)
    pipeline_file = root / "pipelines" / "xgb.yaml"
    pipeline = yaml.safe_load(pipeline_file.read_text())
    refit = pipeline["pipeline"]["steps"]["refit"]["overrides"]["job"]
    # the refit's job is held until the test opens its gate (local jobs get $GATE)
    refit["command"] = 'until [ -e "$GATE" ]; do sleep 0.05; done; python train.py $PAI_USER_ARGS'
    pipeline_file.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    gate = tmp_path / "gate"
    command = [
        sys.executable,
        "-m",
        "paiexp",
        "+pipeline=xgb",
        "pipeline.steps.search.overrides.sweep.n_trials=2",
    ]

    def refit_job_running() -> str | None:
        """The refit's job, once it runs (held at its gate)."""
        for name in job_dirs(root):
            path = root / ".paiexp" / "jobs" / name / "state.json"
            if "-refit-" in name and path.exists() and read_json(path)["state"] == "RUNNING":
                return name
        return None

    launcher = subprocess.Popen(
        command,
        cwd=root,
        env=clean_env(GATE=str(gate)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        refit_job = wait_until(refit_job_running, timeout=240, what="the refit's job running")
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    assert statuses(root, "xgb")["refit"] == "running"
    assert refit_job_running() == refit_job  # held: it runs past the kill

    said = tmp_path / "resumed.log"
    with said.open("w") as stderr:
        resumed = subprocess.Popen(
            command, cwd=root, env=clean_env(), stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        following = f"step refit: following job {refit_job} again"
        wait_until(lambda: following in said.read_text(), 240, "the relaunch to follow the refit")
        assert refit_job_running() == refit_job  # followed while it runs
        gate.touch()
        assert resumed.wait(timeout=300) == 0, said.read_text()
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.wait()
    assert statuses(root, "xgb") == {
        "search": "succeeded",
        "refit": "succeeded",
        "publish": "succeeded",
        "fallback": "skipped",
    }
    assert [name for name in job_dirs(root) if "-refit-" in name] == [refit_job]
    log = (root / ".paiexp" / "jobs" / refit_job / "job.log").read_text()
    assert log.count("test-auc=") == 1  # the job ran once
    _, runs, trials = pipeline_runs(root)
    assert [len(runs[s]) for s in ("search", "refit", "publish", "fallback")] == [1, 1, 1, 1]
    assert runs["refit"][0].info.status == "FINISHED" and len(trials) == 2
