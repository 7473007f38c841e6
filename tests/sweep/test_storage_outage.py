"""The study's database server goes away mid-sweep, and comes back; or is not there at all.

A PostgreSQL cluster of this test's own (tests/servers.py) holds the study, stopped and
started again on its port while two launchers (two hosts) run a sweep.  Each waits in the
call that found it gone; the jobs in flight, held at their gates (tests/gates.py) until the
database is down, end meanwhile, and their trials are told once it is back.  The outage
outlasts the heartbeat grace: neither launcher takes the other for gone because of it.  An
outage past ``sweep.storage_outage_timeout`` ends the launcher with exit code 1, its jobs held
running; the same command, once the database is back, follows them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    assert_nothing_started,
    assert_one_line_error,
    assert_stays,
    clean_env,
    run_paiexp,
    wait_until,
)
from gates import Gates
from servers import Postgres, free_port, running_postgres
from sweep_helpers import (
    children_by_trial,
    counted_trials,
    jobs_dir,
    running_jobs,
    synthetic_project,
)

from paiexp.sweep.records import JOB_NAME
from paiexp.util.jsonfiles import read_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

OUTAGE = 12.0
GRACE = 4.0  # sweep.heartbeat_grace: far shorter than the outage
HOSTS = ("host-a", "host-b")
SLOTS = 4  # two launchers' jobs at once: a wave
N_TRIALS = 2 * SLOTS  # a wave before the outage, and one held running into it
SWEEP = {  # each job is held at its gate (tests/gates.py) until the test lets it end
    "params": {"x": "interval(-3, 3)", "duration": 0.1, "steps": 2},
    "n_trials": N_TRIALS,
    "parallelism": SLOTS // len(HOSTS),
    "sampler": {"name": "random", "seed": 5},
}


@pytest.fixture
def database() -> Iterator[Postgres]:
    """A cluster of this test alone: stopping it disturbs no other test."""
    with running_postgres() as server:
        yield server


def jobs_ended(root: Path) -> dict[str, float]:
    """The local jobs whose commands ended, with when (their state files' ``ended_at``)."""
    states = {d.name: read_json(d / "state.json") for d in jobs_dir(root).iterdir()}
    return {name: s["ended_at"] for name, s in states.items() if s and s.get("ended_at")}


def study_of(url: str) -> Any:
    import optuna

    return optuna.load_study(study_name="syn", storage=url)


def test_trials_that_end_while_the_database_is_down_are_told_when_it_is_back(
    tmp_path: Path, database: Postgres
) -> None:
    from optuna.trial import TrialState

    url = database.database("outage")
    sweep = {**SWEEP, "storage": url, "heartbeat_grace": GRACE}
    root = synthetic_project(tmp_path / "project", sweep)
    ledger = root / "ledger.txt"
    gates = Gates(tmp_path / "gates")
    launchers = {}
    for host in HOSTS:
        with open(root / f"{host}.log", "w") as log:
            launchers[host] = subprocess.Popen(
                [sys.executable, "-m", "paiexp", "+sweep=syn"],
                cwd=root,
                env=clean_env(LEDGER=str(ledger), PAIEXP_LAUNCHER_HOST=host, **gates.env()),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(host: str) -> str:
        return (root / f"{host}.log").read_text()

    try:

        def complete() -> int:
            return len(study_of(url).get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

        # The first wave (both launchers' slots) ends with the database up; the second is
        # held running as the database stops, and let end while it is down.
        gates.open(gates.wait_held(SLOTS))
        wait_until(lambda: complete() == SLOTS, 120, "the first wave's trials to complete")
        in_flight = gates.wait_held(SLOTS)
        database.stop()
        down_at = time.time()
        gates.open(in_flight)
        wait_until(lambda: len(jobs_ended(root)) == N_TRIALS, 120, "the jobs in flight to end")
        for host in HOSTS:
            wait_until(lambda h=host: "is not answering" in log(h), 120, f"{host} to find it gone")
        # The outage outlasts the heartbeat grace, the launchers waiting all the while.
        assert_stays(
            lambda: all(launcher.poll() is None for launcher in launchers.values()),
            max(0.0, down_at + OUTAGE - time.time()),
            "both launchers waiting for the database",
        )
        back_at = time.time()
        database.run()
        for host, launcher in launchers.items():
            code = launcher.wait(timeout=180)
            assert code == 0, log(host)
    finally:
        for launcher in launchers.values():
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()

    for host in HOSTS:
        output = log(host)
        assert "study storage at postgresql://" in output, output
        assert "is not answering" in output and "is back after" in output, output
        # no launcher could heartbeat in the outage: neither takes the other for gone
        assert "its launcher" not in output and "took it over" not in output, output
    trials = study_of(url).get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["COMPLETE"] * N_TRIALS
    assert all(t.value == pytest.approx(t.params["x"] ** 2) for t in trials)
    executions = Counter(float(json.loads(line)["x"]) for line in ledger.read_text().splitlines())
    assert executions == Counter(t.params["x"] for t in trials), "a job ran twice, or never"
    ended = jobs_ended(root)
    in_outage = [t for t in trials if down_at < ended[t.user_attrs[JOB_NAME]] < back_at]
    assert len(in_outage) == SLOTS, f"the outage ({down_at}, {back_at}) held: {ended}"
    # the jobs that ended while the database was down: their trials were told after it
    assert all(t.datetime_complete.timestamp() > back_at for t in in_outage), in_outage
    runs = children_by_trial(root)
    assert sorted(runs) == sorted(str(t.number) for t in trials)
    assert {run.info.status for run in runs.values()} == {"FINISHED"}


def test_past_storage_outage_timeout_it_exits_1_and_the_same_command_follows_the_jobs(
    tmp_path: Path, database: Postgres
) -> None:
    url = database.database("timeout")
    sweep = {**SWEEP, "n_trials": 4, "storage": url, "storage_outage_timeout": 3}
    root = synthetic_project(tmp_path / "project", sweep)
    ledger = root / "ledger.txt"
    gates = Gates(tmp_path / "gates")
    env = clean_env(LEDGER=str(ledger), **gates.env())
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        in_flight = gates.wait_held(SWEEP["parallelism"])
        database.stop()
        stdout, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 1, stdout + stderr
    assert "Traceback" not in stderr, stderr
    error = stderr.splitlines()[-1]
    expected = "paiexp: error: sweep.storage_outage_timeout: the study storage at"
    assert error.startswith(expected), error
    assert error.endswith("the jobs in flight run on, and the same command run again follows them")
    assert sorted(gates.held()) == sorted(in_flight) and len(running_jobs(root)) == len(in_flight)

    database.run()
    with gates.all_open():
        done = run_paiexp(root, "+sweep=syn", env=env)
    assert done.returncode == 0, done.stderr
    trials = counted_trials(study_of(url).get_trials(deepcopy=False))
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    executions = Counter(float(json.loads(line)["x"]) for line in ledger.read_text().splitlines())
    assert executions == Counter(t.params["x"] for t in trials), "a job ran twice, or never"
    runs = children_by_trial(root)
    assert sorted(runs) == sorted(str(t.number) for t in trials)
    assert {run.info.status for run in runs.values()} == {"FINISHED"}


def test_a_database_server_that_is_not_there_is_one_line_naming_sweep_storage(
    tmp_path: Path,
) -> None:
    url = f"postgresql://paiexp@127.0.0.1:{free_port()}/study"
    root = synthetic_project(tmp_path, {**SWEEP, "storage": url})
    done = run_paiexp(root, "+sweep=syn", timeout=60)
    line = assert_one_line_error(done)
    assert line.startswith("paiexp: error: sweep.storage: no database server answers at"), line
    assert "Connection refused" in line, line
    assert_nothing_started(root)
