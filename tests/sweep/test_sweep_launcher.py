"""The asynchronous launcher on a synthetic job: pruning, failures, retries, interrupts.

A job that must still run when something happens to it (pruned, its runner killed, Ctrl-C, the
sweep's timeout) is held at its gate (tests/gates.py) until the test lets it end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env, run_paiexp, wait_until
from gates import Gates
from sweep_helpers import (
    children_by_trial,
    jobs_dir,
    let_end_once_reported,
    load_study,
    running_jobs,
    sweep_runs,
    synthetic_project,
    third_trial_pruned,
)

from paiexp.util.jsonfiles import read_json
from paiexp.util.processes import process_alive

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command


def job_state(root: Path, name: str) -> dict:
    return read_json(jobs_dir(root) / name / "state.json")


def gone(pid: int) -> bool:
    return not process_alive(pid, None)


def start_sweep(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn", *args],
        cwd=root,
        env=env or clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_bad_trials_are_pruned_and_their_jobs_stopped(tmp_path: Path) -> None:
    steps = 5
    root = synthetic_project(
        tmp_path, third_trial_pruned({"x": "interval(-3, 3)", "duration": 0.2, "steps": steps})
    )
    gates = Gates(tmp_path / "gates")
    launcher = start_sweep(root, env=clean_env(**gates.env()))
    let_end_once_reported(gates, root, steps)
    _, err = launcher.communicate(timeout=120)  # the third job is held: it cannot end itself
    assert launcher.returncode == 0, err
    assert len(gates.opened()) == 2  # not the third: it was stopped before it could end
    study = load_study(root)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "PRUNED"]
    pruned = study.trials[2]
    name = pruned.user_attrs["paiexp:job_name"]
    state = job_state(root, name)
    assert state["state"] == "STOPPED"
    assert gone(state["pgid"])
    assert max(pruned.intermediate_values) >= 1
    by_trial = children_by_trial(root)
    assert by_trial["2"].info.status == "KILLED"
    assert by_trial["2"].data.tags["paiexp.trial_state"] == "PRUNED"
    assert by_trial["0"].info.status == "FINISHED"


def test_failures_are_reported_and_max_failures_stops_the_sweep(tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "fail": True, "duration": 0.1},
            "n_trials": 6,
            "parallelism": 1,
            "max_failures": 2,
        },
    )
    result = run_paiexp(root, "+sweep=syn")
    assert result.returncode == 1
    assert "sweep.max_failures=2" in result.stderr
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    assert study.trials[0].user_attrs["paiexp:failure_reason"] == "command exited with code 3"
    _, children = sweep_runs(root)
    assert {c.info.status for c in children} == {"FAILED"}
    assert all("something went wrong" in c.data.tags["paiexp.log_tail"] for c in children)


@pytest.mark.parametrize(
    ("fixed", "reason"),
    [
        ({"silent": True}, "objective metric 'score' never matched regex"),
        ({"nan": True}, "objective metric 'score' is NaN"),
    ],
    ids=["never-matched", "nan"],
)
def test_an_unusable_objective_fails_the_trial(tmp_path: Path, fixed: dict, reason: str) -> None:
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "duration": 0.1, **fixed},
            "n_trials": 2,
        },
    )
    result = run_paiexp(root, "+sweep=syn")
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    message = study.trials[0].user_attrs["paiexp:failure_reason"]
    assert message.startswith(reason)
    if "never matched" in reason:
        assert "score=(" in message and "loss=" in message  # the regex and the log tail
    assert result.returncode == 1  # no trial completed: the sweep failed


def test_a_job_lost_to_the_platform_is_retried(tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "duration": 0.1},
            "n_trials": 2,
            "parallelism": 1,
            "retries": 1,
        },
    )
    gates = Gates(tmp_path / "gates")
    launcher = start_sweep(root, env=clean_env(**gates.env()))
    gates.wait_held(1)  # the job runs, held until the test lets it end
    (victim,) = running_jobs(root)
    os.kill(read_json(victim / "state.json")["runner_pid"], signal.SIGKILL)
    with gates.all_open():
        _out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    study = load_study(root)
    states = [(t.state.name, bool(t.user_attrs.get("paiexp:retried"))) for t in study.trials]
    assert states == [("FAIL", True), ("COMPLETE", False), ("COMPLETE", False)]
    assert study.trials[0].user_attrs["paiexp:failure_reason"] == "the job's runner process died"
    assert study.trials[1].params == study.trials[0].params
    assert study.trials[1].user_attrs["paiexp:attempt"] == 1


def test_ctrl_c_stops_jobs_and_a_rerun_finishes_the_study(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "duration": 0.1},
            "n_trials": 3,
        },
    )
    gates = Gates(tmp_path / "gates")
    env = clean_env(LEDGER=str(ledger), **gates.env())
    launcher = start_sweep(root, env=env)
    gates.wait_held(2)  # both jobs run, held: neither can end before the interrupt
    stopped = [read_json(d / "state.json")["pgid"] for d in running_jobs(root)]
    assert len(stopped) == 2
    launcher.send_signal(signal.SIGINT)
    _out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err
    assert "interrupted" in err
    assert all(gone(pgid) for pgid in stopped)
    study = load_study(root)
    # the interrupted trials failed, and their points wait to run again
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert all(t.user_attrs["paiexp:retried"] for t in study.trials[:2])

    with gates.all_open():
        rerun = run_paiexp(root, "+sweep=syn", env=env)
    assert rerun.returncode == 0, rerun.stderr
    study = load_study(root)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 3
    # the interrupted points ran again (they are not lost), then one new one
    assert {t.params["x"] for t in study.trials[:2]} <= {t.params["x"] for t in complete}
    parents, children = sweep_runs(root)
    assert len(parents) == 1 and len(children) == 5
    assert sorted(c.info.status for c in children).count("KILLED") == 0


def test_ctrl_c_with_detach_leaves_jobs_running_for_the_next_launch(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "duration": 0.1},
            "n_trials": 3,
            "on_interrupt": "detach",
        },
    )
    gates = Gates(tmp_path / "gates")
    env = clean_env(LEDGER=str(ledger), **gates.env())
    launcher = start_sweep(root, env=env)
    held = gates.wait_held(2)  # both jobs run, held until the next launch lets them end
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err
    assert len(running_jobs(root)) == 2 and sorted(gates.held()) == sorted(held)  # detached
    assert [t.state.name for t in load_study(root).trials] == ["RUNNING", "RUNNING"]

    with gates.all_open():
        rerun = run_paiexp(root, "+sweep=syn", env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert "re-attaching" in rerun.stderr
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    lines = ledger.read_text().splitlines()
    assert len(lines) == 3 == len(set(lines))  # no job ran twice
    assert len(sweep_runs(root)[1]) == 3


def test_multi_objective_sweep_over_a_job_key(tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path,
        {
            "objective": [
                {"metric": "score", "direction": "minimize"},
                {"metric": "loss", "direction": "maximize"},
            ],
            "params": {
                "x": "interval(-1, 1)",
                "job.max_run_time": "choice(100, 200)",
                "duration": 0.1,
            },
            "n_trials": 3,
        },
    )
    result = run_paiexp(root, "+sweep=syn")
    assert result.returncode == 0, result.stderr
    study = load_study(root)
    assert [len(t.values) for t in study.trials] == [2, 2, 2]
    for trial in study.trials:
        name = trial.user_attrs["paiexp:job_name"]
        spec = read_json(jobs_dir(root) / name / "spec.json")
        assert spec["max_run_time"] == trial.params["job.max_run_time"]
        assert spec["hyperparameters"]["x"] == str(trial.params["x"])
    parents, _ = sweep_runs(root)
    front = {t.number for t in study.best_trials}
    assert set(map(int, parents[0].data.tags["paiexp.best_trials"].split(","))) == front


def test_timeout_ends_the_sweep_without_failing_it(tmp_path: Path) -> None:
    timeout = 1.0
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "duration": 0.1},
            "n_trials": 10,
            "parallelism": 1,
            "timeout": timeout,
        },
    )
    gates = Gates(tmp_path / "gates")
    launcher = start_sweep(root, env=clean_env(**gates.env()))
    (job,) = gates.wait_held(1)
    # held for the timeout, counted from before it started: the first job ends past it
    held_at = time.monotonic()
    wait_until(lambda: time.monotonic() - held_at > timeout, 10, "sweep.timeout to pass")
    gates.open([job])
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    assert "sweep.timeout of 1 s reached" in err
    assert [t.state.name for t in load_study(root).trials] == ["COMPLETE"]
