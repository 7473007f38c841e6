"""Sweeps defined in Python (``paiexp.start_sweep(job, space=..., objective=...)``): no
``sweeps/`` file, the same checks as one, the same detached launcher, attached by name and
resumed; and ``python -m paiexp --config-file``, the whole config it is launched from."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import REPO, assert_nothing_started, assert_one_line_error, run_paiexp
from sweep_helpers import JOB, load_study, synthetic_project

import paiexp

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command


def synthetic_job(root: Path) -> paiexp.Composed:
    """The synthetic job (tests/synthetic), composed from keyword arguments alone: no conf/."""
    shutil.copytree(REPO / "tests" / "synthetic", root / "synthetic")
    return paiexp.job(
        **{**JOB, "hyperparameters": {"x": 0.0, "duration": 0.1, "steps": 2}},
        environments={"LEDGER": str(root / "ledger.txt")},
        project=root,
    )


def ledger(root: Path) -> list[dict[str, Any]]:
    """What each job of the sweep ran with, one line per job run."""
    return [json.loads(line) for line in (root / "ledger.txt").read_text().splitlines()]


def test_a_sweep_defined_in_python_runs_attaches_and_resumes_as_a_sweeps_file(
    tmp_path: Path,
) -> None:
    job = synthetic_job(tmp_path)
    sweep = paiexp.start_sweep(
        job,
        space={
            "x": "interval(0.0, 3.0)",  # the sweeps/ grammar
            "steps": optuna.distributions.IntDistribution(2, 4),  # an Optuna distribution
        },
        objective="score",
        n_trials=4,
        parallelism=2,
        sampler={"name": "random", "seed": 7},
        name="defined",
        wait=True,
    )
    assert sweep.study_name == "defined"
    assert sweep.counts()["complete"] == 4
    results = sweep.results()
    assert len(results) == 4
    assert results["x"].between(0.0, 3.0).all() and results["steps"].isin([2, 3, 4]).all()
    assert sweep.best.value == results["score"].min()

    attached = paiexp.attach_sweep("defined", project=tmp_path)
    assert attached.counts() == sweep.counts()

    saved = tmp_path / ".paiexp" / "sweeps" / "defined.yaml"
    assert "interval(0.0, 3.0)" in saved.read_text()  # launched from its whole config
    resumed = sweep.resume(n_trials=6, wait=True)
    assert resumed.counts()["complete"] == 6
    runs = Counter(json.dumps(line, sort_keys=True) for line in ledger(tmp_path))
    assert len(runs) == 6 and set(runs.values()) == {1}, "a job ran twice"


def test_the_saved_config_runs_from_the_command_line_with_edits(tmp_path: Path) -> None:
    job = synthetic_job(tmp_path)
    paiexp.start_sweep(
        job, space={"x": "choice(1.0, 2.0)"}, objective="score", n_trials=1, wait=True
    )
    saved = next((tmp_path / ".paiexp" / "sweeps").glob("*.yaml"))
    done = run_paiexp(tmp_path, "--config-file", str(saved), "sweep.n_trials=2")
    assert done.returncode == 0, done.stderr
    assert len(ledger(tmp_path)) == 2  # one more job: the study went on from its first trial
    sweep = paiexp.attach_sweep(saved.stem, project=tmp_path)
    assert sweep.counts()["complete"] == 2


@pytest.mark.parametrize(
    "space, objective, settings, message",
    [
        (None, "score", {}, "start_sweep: space= is required"),
        ({"x": "interval(0, 1)"}, None, {}, "start_sweep: objective= is required"),
        ({"x": "interval(0, 1)"}, "score", {"n_trial": 3}, "sweep.n_trial: unknown key"),
        ({"x": "interval(3, 1)"}, "score", {}, "x"),
        ({"x": "interval(0, 1)"}, "nope", {}, "sweep.objective"),
        ({"x": "interval(0, 1)"}, "score", {"parallelism": "many"}, "sweep.parallelism"),
    ],
    ids=["no space", "no objective", "unknown setting", "empty interval", "unknown metric", "type"],
)
def test_a_bad_sweep_definition_is_one_line_and_nothing_starts(
    tmp_path: Path, space: Any, objective: Any, settings: dict[str, Any], message: str
) -> None:
    job = synthetic_job(tmp_path)
    with pytest.raises(paiexp.ConfigError) as raised:
        paiexp.start_sweep(job, space=space, objective=objective, **settings)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert_nothing_started(tmp_path)


def test_sweep_settings_without_a_composed_job_say_how_to_define_one(tmp_path: Path) -> None:
    with pytest.raises(paiexp.ConfigError, match=r"space= defines a sweep of a composed job"):
        paiexp.start_sweep("+sweep=xgb", space={"x": "interval(0, 1)"}, project=tmp_path)
    assert_nothing_started(tmp_path)


@pytest.mark.parametrize(
    "content, message",
    [
        ("job: [1, 2\n", "is not valid YAML"),
        ("just a string\n", "holds no whole config"),
        ("job:\n  name: x\n", "holds no whole config"),
        (None, "cannot read"),
    ],
    ids=["broken YAML", "a string", "no backend", "missing"],
)
def test_a_config_file_that_is_no_config_is_one_line(
    tmp_path: Path, content: str | None, message: str
) -> None:
    config = tmp_path / "given.yaml"
    if content is not None:
        config.write_text(content)
    done = run_paiexp(tmp_path, "--config-file", str(config))
    assert message in assert_one_line_error(done)
    assert_nothing_started(tmp_path)


def test_what_cfg_all_prints_runs_again_from_config_file_with_edits(tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path, {"params": {"x": "interval(0, 1)", "duration": 0.1, "steps": 2}, "n_trials": 2}
    )
    printed = run_paiexp(root, "+sweep=syn", "--cfg", "all")
    assert printed.returncode == 0, printed.stderr
    assert_nothing_started(root)  # printing ran nothing
    (root / "all.yaml").write_text(printed.stdout)
    done = run_paiexp(root, "--config-file", "all.yaml", "sweep.n_trials=3")
    assert done.returncode == 0, done.stderr
    assert [t.state.name for t in load_study(root).trials] == ["COMPLETE"] * 3
