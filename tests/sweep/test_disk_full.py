"""The disk fills up mid-sweep, and is grown again.

The project lives on a small tmpfs of this test's own (the test runs as root to mount it).
Once two trials are complete and two jobs run (held at their gates, tests/gates.py), a ballast
file takes every byte left, and the two jobs are let end on the full disk: the launcher stops
with one line naming what it could not write (exit 1, no traceback), the study journal,
``mlflow.db`` and the jobs' state files still read as their last good state, and once the
file system is grown the same command completes the study: each job ran once, and no trial
is counted failed because of the disk.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import clean_env, fill_disk, run_paiexp, wait_until
from gates import Gates
from sweep_helpers import load_study, running_jobs, sweep_runs, synthetic_project

from paiexp.util.jsonfiles import read_json
from paiexp.util.processes import process_alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N_TRIALS = 6
SWEEP = {
    "params": {"x": "interval(-3, 3)", "duration": 0.1, "steps": 10, "model": "true"},
    "n_trials": N_TRIALS,
    "parallelism": 2,
    "heartbeat_grace": 4,  # a trial asked for as the disk filled is adopted soon
    "sampler": {"name": "random", "seed": 3},
}
LINE = "paiexp: error: no space left on device writing "
ADVICE = ": free space, then run the same command again (details in "


def assert_readable(root: Path) -> None:
    """The journal, the tracking database and every job's state file read whole."""
    load_study(root).get_trials(deepcopy=False)
    with sqlite3.connect(f"file:{root / 'mlflow.db'}?mode=ro", uri=True) as database:
        assert database.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    database.close()
    for state in (root / ".paiexp" / "jobs").glob("*/state.json"):
        json.loads(state.read_text())


def finished_runs(root: Path) -> int:
    """How many runs ``mlflow.db`` holds closed (read only: a test that opened it through
    MLflow would make it)."""
    path = root / "mlflow.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as database:
        try:
            return database.execute(
                "SELECT count(*) FROM runs WHERE status = 'FINISHED'"
            ).fetchone()[0]
        except sqlite3.OperationalError:  # its tables not made yet
            return 0


def test_a_full_disk_stops_the_sweep_in_one_line_and_the_relaunch_completes_it(
    tmp_path: Path, small_disk: Path
) -> None:
    from optuna.trial import TrialState

    root = synthetic_project(small_disk / "project", SWEEP)
    ledger = tmp_path / "ledger.txt"  # off the small disk: every execution is counted
    gates = Gates(tmp_path / "gates")  # off it too
    env = clean_env(LEDGER=str(ledger), TMPDIR=str(tmp_path), **gates.env())  # details: TMPDIR
    output = tmp_path / "launcher.txt"
    with open(output, "w") as stream:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+sweep=syn"],
            cwd=root,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    try:
        gates.open(gates.wait_held(2))  # the first two trials end with room left
        held = gates.wait_held(2)  # the third and fourth trials' jobs run, held
        # what the disk holds as it fills: the first two trials' runs closed in mlflow.db
        wait_until(lambda: finished_runs(root) == 2, 120, "the first two trials' runs to close")
        in_flight = {d.name: read_json(d / "state.json")["pgid"] for d in running_jobs(root)}
        assert len(in_flight) == 2, in_flight
        printed_before = len(output.read_text().splitlines())
        fill_disk(small_disk)
        gates.open(held)
        wait_until(
            lambda: not any(process_alive(pgid, None) for pgid in in_flight.values()),
            60,
            "the jobs in flight to end on the full disk",
        )
        code = launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()

    text = output.read_text()
    assert code == 1, text
    assert "Traceback" not in text and "sqlalchemy" not in text.lower(), text
    since_full = text.splitlines()[printed_before:]
    assert 1 <= len(since_full) <= 3, since_full  # at most the trials in flight, and the error
    error = since_full[-1]
    assert error.startswith(LINE) and ADVICE in error and error.endswith(")"), error
    details = Path(error.rpartition("(details in ")[2].rstrip(")"))
    assert "Traceback" in (details if details.is_absolute() else root / details).read_text()
    assert_readable(root)  # the disk still full

    subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
    with gates.all_open():
        done = run_paiexp(root, "+sweep=syn", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_readable(root)

    trials = load_study(root).get_trials(deepcopy=False)
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    assert len(complete) == N_TRIALS, [(t.number, t.state.name) for t in trials]
    failed = [t for t in trials if t.state is TrialState.FAIL]
    assert all(t.user_attrs.get("paiexp:retried") for t in failed), [
        (t.number, t.user_attrs.get("paiexp:failure_reason")) for t in failed
    ]  # a job the disk failed is the platform's failure: re-run, not counted
    assert set(in_flight) <= {t.user_attrs.get("paiexp:job_name") for t in failed}
    assert len(trials) == N_TRIALS + len(failed)
    ran = [t for t in trials if "paiexp:job_id" in t.user_attrs]  # each trial with a job
    executions = Counter(float(json.loads(line)["x"]) for line in ledger.read_text().splitlines())
    assert executions == Counter(t.params["x"] for t in ran), "a job ran twice, or never"
    _, children = sweep_runs(root)
    runs = Counter(run.data.tags["paiexp.trial_number"] for run in children)
    assert runs == Counter(str(t.number) for t in ran), "a trial has no run, or two"
    statuses = {run.data.tags["paiexp.trial_number"]: run.info.status for run in children}
    assert {statuses[str(t.number)] for t in complete} == {"FINISHED"}


def test_a_job_log_that_cannot_be_copied_names_its_file(tmp_path: Path, small_disk: Path) -> None:
    """The launcher's copy of a job's log fails on a full disk when it is flushed, an error
    naming no file: the disk-full line still names it."""
    from paiexp.backends import JobState
    from paiexp.backends.local import LocalBackend
    from paiexp.config.schema import LocalBackendConfig
    from paiexp.config.spec import JobSpec
    from paiexp.tracking.monitor import JobMonitor
    from paiexp.util.diskfull import disk_full

    backend = LocalBackend(LocalBackendConfig(root=str(tmp_path / "jobs")), tmp_path)
    handle = backend.submit(JobSpec(name="talk", command="echo one; echo two"))
    backend.wait([handle], 60)
    wait_until(lambda: backend.poll([handle])[handle.id].state is JobState.SUCCEEDED, 60, "end")
    copy = small_disk / "talk.log"
    monitor = JobMonitor(backend, handle, JobSpec(name="talk", command="x"), copy)
    fill_disk(small_disk)
    with pytest.raises(OSError) as raised:
        monitor.pull(final=True)
    full = disk_full(raised.value)
    assert full is not None and full.path == str(copy), raised.value


class SQLiteError(Exception):
    """An error as Python's sqlite3 raises it: with SQLite's extended result code."""

    def __init__(self, code: int) -> None:
        super().__init__("disk I/O error")
        self.sqlite_errorcode = code


SQLITE_IOERR_SHMSIZE = 10 | (19 << 8)  # a write-ahead log's shared memory could not grow


def test_an_sqlite_io_error_is_a_full_disk_only_where_the_disk_is_full(
    tmp_path: Path, small_disk: Path
) -> None:
    from paiexp.util.diskfull import disk_full

    error = SQLiteError(SQLITE_IOERR_SHMSIZE)
    assert disk_full(error, str(small_disk / "mlflow.db")) is None  # room left: an I/O error
    assert disk_full(error, str(tmp_path / "mlflow.db")) is None
    fill_disk(small_disk)
    full = disk_full(error, str(small_disk / "mlflow.db"))
    assert full is not None and full.path == str(small_disk / "mlflow.db")
    assert disk_full(error) is None  # which file's disk is unknown: not guessed
