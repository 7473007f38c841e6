"""Pipelines of a synthetic job: conditions and skipping, failure propagation, steps at the
same time, a failed step's next attempt, a changed completed step, --rerun."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_paiexp, wait_until
from gates import Gates, cleaned_up
from pipeline_helpers import job_dirs, pipeline_runs, state, statuses, write_pipeline
from sweep_helpers import synthetic_project

pytestmark = pytest.mark.slow


def hyperparameters(**values: object) -> dict[str, object]:
    return {"job": {"hyperparameters": {"duration": 0.2, "steps": 2, **values}}}


def running_step_runs(root: Path) -> dict[str, int]:
    """The start time (ms) of each step's RUNNING run in ``mlflow.db`` (read only)."""
    path = root / "mlflow.db"
    if not path.exists():
        return {}
    query = (
        "SELECT tags.value, runs.start_time FROM runs JOIN tags ON tags.run_uuid = runs.run_uuid"
        " WHERE tags.key = 'paiexp.pipeline_step' AND runs.status = 'RUNNING'"
    )
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as database:
        try:
            return dict(database.execute(query).fetchall())
        except sqlite3.OperationalError:  # its tables not made yet
            return {}


def test_false_condition_skips_the_step_and_its_dependents(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}})
    steps = {
        "first": {"overrides": hyperparameters(x=1.0)},
        "big": {"depends": ["first"], "when": "steps.first.metrics.score > 5"},
        "after_big": {"depends": ["big"]},
        "small": {"depends": ["first"], "when": "steps.first.metrics.score <= 5"},
    }
    write_pipeline(root, "branch", steps)
    done = run_paiexp(root, "+pipeline=branch")
    assert done.returncode == 0, done.stderr
    assert statuses(root, "branch") == {
        "first": "succeeded",
        "big": "skipped",
        "after_big": "skipped",
        "small": "succeeded",
    }
    parent, runs, others = pipeline_runs(root)
    assert parent.info.status == "FINISHED" and not others
    assert {step: len(found) for step, found in runs.items()} == dict.fromkeys(steps, 1)
    (big,) = runs["big"]
    assert big.info.status == "FINISHED"
    assert big.data.tags["paiexp.step_status"] == "skipped"
    assert big.data.tags["paiexp.when"] == "steps.first.metrics.score > 5"
    assert big.data.tags["paiexp.when_values"] == "steps.first.metrics.score = 1.0"
    (after_big,) = runs["after_big"]
    assert after_big.data.tags["paiexp.skip_reason"] == "big was skipped"
    assert len(job_dirs(root)) == 2  # first and small

    again = run_paiexp(root, "+pipeline=branch")
    assert again.returncode == 0, again.stderr
    assert len(job_dirs(root)) == 2
    assert {s: len(r) for s, r in pipeline_runs(root)[1].items()} == dict.fromkeys(steps, 1)
    # a state file that lost its parent run's id finds the run again by the pipeline's id
    lost = state(root, "branch") | {"run_id": None, "closed_as": None}
    (root / ".paiexp" / "pipelines" / "branch.json").write_text(json.dumps(lost))
    found = run_paiexp(root, "+pipeline=branch")
    assert found.returncode == 0, found.stderr
    assert pipeline_runs(root)[0].info.run_id == parent.info.run_id
    assert state(root, "branch")["run_id"] == parent.info.run_id

    # A completed step whose config changed is a one-line error, unless --rerun asks for it
    steps["first"] = {"overrides": hyperparameters(x=3.0)}
    write_pipeline(root, "branch", steps)
    changed = run_paiexp(root, "+pipeline=branch")
    line = assert_one_line_error(changed)
    assert "pipeline.steps.first: changed since the step succeeded" in line
    assert "job.hyperparameters.x: 1.0 -> 3.0" in line and "--rerun first" in line
    assert len(job_dirs(root)) == 2

    rerun = run_paiexp(root, "+pipeline=branch", "--rerun", "first")
    assert rerun.returncode == 0, rerun.stderr
    assert statuses(root, "branch") == {
        "first": "succeeded",
        "big": "succeeded",  # score 9 > 5 now
        "after_big": "succeeded",
        "small": "skipped",
    }
    assert len(job_dirs(root)) == 5  # first again, big, after_big
    assert state(root, "branch")["steps"]["first"]["attempt"] == 1


def test_failed_step_stops_its_dependents_only_and_runs_again_next_time(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}})
    ledger = tmp_path / "ledger.txt"
    steps = {
        "bad": {"overrides": hyperparameters(fail="true")},
        "after_bad": {"depends": ["bad"]},
        "good": {"overrides": hyperparameters()},
    }
    write_pipeline(root, "fails", steps)
    env = clean_env(LEDGER=str(ledger))
    gates = Gates(tmp_path / "gates")  # both steps' jobs held until both steps' runs are made
    output = tmp_path / "launcher.txt"
    with output.open("w") as stream:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+pipeline=fails"],
            cwd=root,
            env={**env, **gates.env()},
            stdout=subprocess.DEVNULL,
            stderr=stream,
        )
    with cleaned_up(gates, [launcher]):
        held = gates.wait_held(2)
        starts = wait_until(
            lambda: (found := running_step_runs(root)).keys() == {"bad", "good"} and found,
            120,
            "both steps' runs to be made",
        )
        opened = time.time() * 1000
        assert max(starts.values()) <= opened and len(gates.held()) == 2  # neither could end
        gates.open(held)
        code = launcher.wait(timeout=120)
    assert code == 1, output.read_text()
    assert statuses(root, "fails") == {"bad": "failed", "after_bad": "not-run", "good": "succeeded"}
    parent, runs, _ = pipeline_runs(root)
    assert parent.info.status == "FAILED"
    assert parent.data.tags["paiexp.step.after_bad"] == "not-run"
    (bad,), (good,) = runs["bad"], runs["good"]
    assert bad.info.status == "FAILED" and good.info.status == "FINISHED"
    # independent steps ran at the same time
    assert max(bad.info.start_time, good.info.start_time) < min(
        bad.info.end_time, good.info.end_time
    )

    steps["bad"] = {"overrides": hyperparameters(duration=0.2)}  # fixed
    write_pipeline(root, "fails", steps)
    fixed = run_paiexp(root, "+pipeline=fails", env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert set(statuses(root, "fails").values()) == {"succeeded"}
    assert state(root, "fails")["steps"]["bad"]["attempt"] == 1
    runs = pipeline_runs(root)[1]
    assert [len(runs[s]) for s in ("bad", "after_bad", "good")] == [2, 1, 1]
    # bad ran twice (two jobs), after_bad and good once each
    assert len(ledger.read_text().splitlines()) == 4


def test_ctrl_c_stops_the_running_steps_and_starts_no_more(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}})
    write_pipeline(
        root,
        "long",
        {
            "slow": {"overrides": hyperparameters(duration=120, steps=120)},
            "after": {"depends": ["slow"]},
        },
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+pipeline=long"],
        cwd=root,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: job_dirs(root), timeout=120, what="the slow step's job started")
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, stderr
    assert statuses(root, "long") == {"slow": "stopped", "after": "not-run"}
    parent, runs, _ = pipeline_runs(root)
    assert parent.info.status == "KILLED"
    assert runs["slow"][0].info.status == "KILLED" and "after" not in runs


def test_a_sweep_steps_best_point_feeds_a_later_step_value_by_value(tmp_path: Path) -> None:
    sweep = {
        "params": {"x": "interval(-1, 1)", "duration": 0.2, "steps": 2},  # two of them fixed
        "n_trials": 2,
        "sampler": {"name": "random", "seed": 1},
    }
    root = synthetic_project(tmp_path, sweep)
    steps = {
        "search": {"sweep": "syn"},
        "check": {
            "depends": ["search"],
            "when": "steps.search.best.value < 1",
            "overrides": {
                "job.hyperparameters.x": "${steps.search.best.params.x}",
                "job.hyperparameters.steps": "${steps.search.best.params.steps}",
                "job.labels.best_trial": "trial-${steps.search.best.trial}",
            },
        },
    }
    write_pipeline(root, "tune", steps)
    done = run_paiexp(root, "+pipeline=tune")
    assert done.returncode == 0, done.stderr
    assert statuses(root, "tune") == {"search": "succeeded", "check": "succeeded"}
    search = state(root, "tune")["steps"]["search"]["results"]
    best = search["best"]
    assert best["params"] == {"x": best["params"]["x"], "duration": 0.2, "steps": 2}
    _, runs, trials = pipeline_runs(root)
    (check,) = runs["check"]
    assert float(check.data.params["x"]) == best["params"]["x"]
    assert check.data.metrics["score"] == pytest.approx(best["value"])  # the same point again
    config = state(root, "tune")["steps"]["check"]["config"]["job"]
    assert config["labels"]["best_trial"] == f"trial-{best['trial']}"
    assert {t.data.tags["mlflow.parentRunId"] for t in trials} == {search["run_id"]}
