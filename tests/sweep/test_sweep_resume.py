"""Crash-safe resume: a launcher SIGKILLed mid-sweep loses no trial, runs no job twice.

Every job is held at its gate (tests/gates.py).  Each launch is killed once it follows two
jobs, at one of the MOMENTS, each made to happen: with both jobs running; with one of them
ended but its trial not told (the launcher stopped, SIGSTOP, before the test lets the job end);
with one told and the next trial's job started.  The other job is held running all along: in
flight as the launcher dies.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import clean_env, run_paiexp, wait_until
from gates import Gates
from sweep_helpers import jobs_dir, load_study, sweep_runs, synthetic_project

from paiexp.sweep.claims import FileClaims
from paiexp.sweep.records import OWNER
from paiexp.util.jsonfiles import read_json
from paiexp.util.processes import process_stat

pytestmark = pytest.mark.slow
N_TRIALS = 12
PARALLELISM = 2
MOMENTS = ("jobs running", "job ended", "next job held") * 2  # one launch killed at each


def following(root: Path, pid: int) -> int:
    """How many RUNNING trials the launcher of process ``pid`` follows."""
    trials = load_study(root).get_trials(deepcopy=False)
    running = [t for t in trials if t.state.name == "RUNNING"]
    return sum(str(t.user_attrs.get(OWNER, "")).split(":")[1:2] == [str(pid)] for t in running)


def jobs_ended(root: Path) -> int:
    return sum(
        (read_json(d / "state.json") or {}).get("state") == "SUCCEEDED"
        for d in jobs_dir(root).iterdir()
    )


def told(root: Path) -> int:
    return sum(t.state.name == "COMPLETE" for t in load_study(root).get_trials(deepcopy=False))


def launch_killed_at(moment: str, root: Path, env: dict[str, str], gates: Gates) -> list[Path]:
    """Launch the sweep and SIGKILL it at ``moment``, once it follows two jobs; returns the
    jobs it left in flight, held."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: (
                len(gates.held()) == PARALLELISM and following(root, launcher.pid) == PARALLELISM
            ),
            120,
            "the launcher to follow two jobs, held",
        )
        oldest = min(gates.held(), key=lambda job: job.stat().st_mtime)
        if moment == "job ended":
            launcher.send_signal(signal.SIGSTOP)
            wait_until(lambda: process_stat(launcher.pid)[0] == "T", 60, "the launcher to stop")
            ended, complete = jobs_ended(root), told(root)
            gates.open([oldest])
            wait_until(lambda: jobs_ended(root) > ended, 60, "the job to end")
            assert told(root) == complete, "its trial was told"
        elif moment == "next job held":
            gates.open([oldest])
            wait_until(lambda: len(gates.held()) == PARALLELISM, 120, "the next trial's job")
        in_flight = gates.held()
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    return in_flight


def test_sigkilled_launcher_resumes_exactly(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "duration": 0.1, "steps": 4},
            "n_trials": N_TRIALS,
            "parallelism": PARALLELISM,
        },
    )
    gates = Gates(tmp_path / "gates")
    env = clean_env(LEDGER=str(ledger), **gates.env())
    for moment in MOMENTS:
        in_flight = launch_killed_at(moment, root, env, gates)
        assert in_flight and set(in_flight) <= set(gates.held()), f"{moment}: none in flight"
    with gates.all_open():
        final = run_paiexp(root, "+sweep=syn", env=env)
    assert final.returncode == 0, final.stderr

    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * N_TRIALS
    names = [t.user_attrs["paiexp:job_name"] for t in study.trials]
    assert len(set(names)) == N_TRIALS
    lines = ledger.read_text().splitlines()
    assert len(lines) == N_TRIALS and len(set(lines)) == N_TRIALS, f"jobs ran {len(lines)} times"
    assert {float(json.loads(line)["x"]) for line in lines} == {t.params["x"] for t in study.trials}
    parents, children = sweep_runs(root)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == N_TRIALS
    assert {c.info.status for c in children} == {"FINISHED"}
    assert sorted(int(c.data.tags["paiexp.trial_number"]) for c in children) == list(
        range(N_TRIALS)
    )
    assert parents[0].data.metrics["best_score"] == study.best_value
    # every run, closed by whichever launch saw its job end, says what its job cost
    hours = [c.data.metrics.get("instance_hours") for c in children]
    assert all(h is not None and h > 0 for h in hours), hours
    assert parents[0].data.metrics["instance_hours"] == pytest.approx(sum(hours))


def test_the_lock_of_a_launcher_killed_asking_is_broken(tmp_path: Path) -> None:
    """The lock beside a journal that launchers take in turn to ask for a trial, left by one
    SIGKILLed holding it, is broken once its grace period passes."""
    journal = str(tmp_path / "optuna.journal")
    hold = "\n".join(
        [
            "import time",
            "from paiexp.sweep.claims import FileClaims",
            f"with FileClaims(None, {journal!r}).exclusive():",
            "    print('held', flush=True)",
            "    time.sleep(600)",
        ]
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait()
    claims = FileClaims(None, journal)
    claims.lock.grace_period = 3  # Optuna's 30 s, shortened
    acquired = threading.Event()

    def ask() -> None:
        with claims.exclusive():
            acquired.set()

    threading.Thread(target=ask, daemon=True).start()
    assert acquired.wait(60), "the lock was never broken"
