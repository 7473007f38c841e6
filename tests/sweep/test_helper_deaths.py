"""paiexp's own helper processes die mid-sweep (the tracking process, the warm interpreter, the
standby runner): nothing is lost, nothing hangs, no trial is counted failed for it.

Every job is held at its gate (tests/gates.py) while a helper is killed, so the jobs run at
the kill by construction; a tracking process is stopped (SIGSTOP) before the jobs it must miss
end, so the calls it dies without doing were surely sent.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, wait_until
from gates import Gates, cleaned_up
from sweep_helpers import counted_trials, load_study, sweep_runs, synthetic_project

from paiexp.sweep.tracking import MAX_RESTARTS, SweepTracker
from paiexp.sweep.tracking_messages import TrackingSetup
from paiexp.util.processes import process_alive, process_stat

pytestmark = pytest.mark.slow

N_TRIALS = 6
STEPS = 5


def children_of(pid: int) -> list[int]:
    """The processes ``pid`` started (its threads' children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def tracking_process_of(launcher: int) -> int | None:
    """The launcher's tracking process (a ``multiprocessing`` spawn), if it has one now."""
    spawned = [pid for pid in children_of(launcher) if "spawn_main" in cmdline(pid)]
    return spawned[0] if len(spawned) == 1 else None


def runs_by_status(root: Path) -> dict[str, int]:
    """How many runs ``mlflow.db`` holds in each status (read only)."""
    path = root / "mlflow.db"
    if not path.exists():
        return {}
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as database:
        try:
            rows = database.execute("SELECT status, count(*) FROM runs GROUP BY status")
            return dict(rows.fetchall())
        except sqlite3.OperationalError:  # its tables not made yet
            return {}


def start_sweep(
    root: Path, env: dict[str, str], output: Path, **options: Any
) -> subprocess.Popen[bytes]:
    """``paiexp +sweep=syn`` in ``root``, what it says written to ``output``."""
    with open(output, "w") as stream:
        return subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+sweep=syn"],
            cwd=root,
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
            **options,
        )


def assert_runs_whole(root: Path) -> None:
    """Every trial COMPLETE once; one FINISHED parent, one FINISHED child per trial with its
    whole loss series (each step once) and its score."""
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * N_TRIALS
    parents, children = sweep_runs(root)
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert sorted(int(c.data.tags["paiexp.trial_number"]) for c in children) == list(
        range(N_TRIALS)
    )
    assert_series_whole(root, children)


def assert_series_whole(root: Path, children: list[Any]) -> None:
    """Each child run FINISHED with its score and its whole loss series, each step once."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    for child in children:
        assert child.info.status == "FINISHED", child.data.tags["paiexp.trial_number"]
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "loss")]
        assert sorted(steps) == list(range(STEPS)), (child.data.tags["paiexp.job_name"], steps)
        assert "score" in child.data.metrics


def test_a_killed_tracking_process_is_replaced_and_the_sweep_ends_whole(tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path / "project",
        {
            "params": {"x": "interval(-3, 3)", "duration": 0.1, "steps": STEPS},
            "n_trials": N_TRIALS,
            "parallelism": 2,
        },
    )
    gates = Gates(tmp_path / "gates")
    output = tmp_path / "launcher.txt"
    launcher = start_sweep(root, clean_env(**gates.env()), output)
    with cleaned_up(gates, [launcher]):
        # 1. killed with both trials' runs made and their jobs held
        gates.wait_held(2)
        wait_until(lambda: runs_by_status(root).get("RUNNING") == 3, 120, "the runs to be made")
        first = tracking_process_of(launcher.pid)
        assert first is not None and launcher.poll() is None
        subprocess.run(["kill", "-KILL", str(first)], check=True)
        gates.open(gates.held())

        # 2. stopped, then the next trials end and two more start: their calls wait in its
        # queue, undone, as it is killed
        gates.wait_held(2)
        second = wait_until(
            lambda: (pid := tracking_process_of(launcher.pid)) != first and pid, 120, "a new one"
        )
        wait_until(lambda: runs_by_status(root).get("FINISHED") == 2, 120, "two runs closed")
        subprocess.run(["kill", "-STOP", str(second)], check=True)
        wait_until(lambda: (process_stat(second) or ["?"])[0] == "T", 60, "it to stop")
        gates.open(gates.held())
        gates.wait_held(2)  # the launcher told the finishes and the starts
        assert runs_by_status(root).get("FINISHED") == 2, "the stopped process closed a run"
        subprocess.run(["kill", "-KILL", str(second)], check=True)

        with gates.all_open():
            code = launcher.wait(timeout=180)
    said = output.read_text()
    assert code == 0, said
    deaths = re.findall(
        r"the tracking process died \(killed by SIGKILL\); a new one applies the (\d+)", said
    )
    assert len(deaths) == 2 and said.count("the tracking process died") == 2, said
    assert int(deaths[1]) >= 4, said  # the two finishes and two starts it never did
    assert "Traceback" not in said
    assert_runs_whole(root)


def test_a_tracking_process_that_keeps_dying_fails_the_tracking_without_a_hang(
    tmp_path: Path,
) -> None:
    """Killed before it could do any call, again and again: after MAX_RESTARTS new ones the
    tracking has failed (the launcher stops starting trials, says so, exits non-zero) and
    closing it returns at once."""
    setup = TrackingSetup(
        tracker_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        experiment="deaths",
        storage=str(tmp_path / "optuna.journal"),
        study_name="deaths",
        backend=None,
        base_dir=tmp_path,
        overrides=(),
        source=None,
    )
    tracker = SweepTracker(setup)
    said: list[str] = []
    tracker.notify = said.append
    killed = []
    for _ in range(MAX_RESTARTS + 1):
        process = tracker._started.process
        assert process.is_alive()
        process.kill()
        process.join()
        killed.append(process.pid)
        tracker.take_replies()  # finds it dead
    assert len(said) == MAX_RESTARTS and all("died (killed by SIGKILL)" in s for s in said)
    assert tracker.fatal is not None and "died 4 times in a row" in tracker.fatal
    assert tracker.close() is None
    assert len(set(killed)) == MAX_RESTARTS + 1


def warm_interpreters_of(launcher: int) -> list[int]:
    """The launcher's warm interpreters (paiexp.backends.warm), alive now."""
    return [
        pid
        for pid in children_of(launcher)
        if "backends import warm" in cmdline(pid) and (process_stat(pid) or ["Z"])[0] != "Z"
    ]


def test_jobs_outlive_a_killed_warm_interpreter_and_a_new_one_serves_the_next(
    tmp_path: Path,
) -> None:
    root = synthetic_project(
        tmp_path / "project",
        {
            "params": {"x": "interval(-3, 3)", "duration": 0.1, "steps": STEPS},
            "n_trials": N_TRIALS,
            "parallelism": 2,
            "retries": 1,
        },
    )
    gates = Gates(tmp_path / "gates")
    output = tmp_path / "launcher.txt"
    launcher = start_sweep(root, clean_env(**gates.env()), output)
    with cleaned_up(gates, [launcher]):
        held = gates.wait_held(2)
        (warm,) = warm_interpreters_of(launcher.pid)
        forked = [gates.pid(job) for job in held]
        assert [parent_of(pid) for pid in forked] == [warm, warm], "not forked warm"
        subprocess.run(["kill", "-KILL", str(warm)], check=True)
        wait_until(lambda: not warm_interpreters_of(launcher.pid), 60, "it to die")
        assert all(process_alive(pid, None) for pid in forked), "a job died with it"
        # one job ends as it should; the other is killed untold: its exit status is lost
        subprocess.run(["kill", "-KILL", str(forked[1])], check=True)
        gates.open(held)

        # the next trials' jobs are forked by a new warm interpreter
        following = gates.wait_held(2)
        (new_warm,) = warm_interpreters_of(launcher.pid)
        assert new_warm != warm
        assert [parent_of(gates.pid(job)) for job in following] == [new_warm, new_warm]
        with gates.all_open():
            code = launcher.wait(timeout=180)
    said = output.read_text()
    assert code == 0, said
    assert "out of memory" not in said and "Traceback" not in said
    assert "the tracking process died" not in said  # its normal end is no death
    trials = load_study(root).trials
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert len(failed) == 1 and failed[0].user_attrs.get("paiexp:retried"), said
    assert "its warm interpreter died" in failed[0].user_attrs["paiexp:failure_reason"]
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == N_TRIALS and len(trials) == N_TRIALS + 1


def parent_of(pid: int) -> int | None:
    """``pid``'s parent process, None once it is gone."""
    stat = process_stat(pid)
    return int(stat[1]) if stat else None


HELPERS = ("tracking process", "standby runner", "warm interpreter")
CHAOS_SEED = int(os.environ.get("PAIEXP_CHAOS_SEED", "20261127"))
CHAOS_TRIALS = 12
FAULTS = 8  # each lets one job end: two are always in flight as the next fault comes


def helpers_of(launcher: int) -> dict[str, int]:
    """The launcher's helper processes alive now, by kind."""
    found = {}
    for pid in children_of(launcher):
        line = cmdline(pid)
        if (process_stat(pid) or ["Z"])[0] == "Z":
            continue
        if "spawn_main" in line:
            found["tracking process"] = pid
        elif "local_runner.py --standby" in line:
            found["standby runner"] = pid
        elif "backends import warm" in line:
            found["warm interpreter"] = pid
    return found


@pytest.mark.timeout(600)
def test_random_kills_of_the_launcher_and_its_helpers_lose_nothing(tmp_path: Path) -> None:
    """FAULTS times, with both trials' jobs held running: one is let end and, as the launcher
    tells it and asks for the next, the launcher or one of its helpers is SIGKILLed (each kind
    first, in a seeded random order, then any; no more than two tracking processes in a row,
    so that it is not given up); a killed launcher is launched again.  Every trial completes
    exactly once, each job ran once, each run is whole.  ``PAIEXP_CHAOS_SEED`` picks another
    sequence."""
    root = synthetic_project(
        tmp_path / "project",
        {
            "params": {"x": "interval(-3, 3)", "duration": 0.1, "steps": STEPS},
            "n_trials": CHAOS_TRIALS,
            "parallelism": 2,
        },
    )
    ledger = tmp_path / "ledger.txt"
    gates = Gates(tmp_path / "gates")
    env = clean_env(LEDGER=str(ledger), **gates.env())
    rng = random.Random(CHAOS_SEED)
    outputs: list[Path] = []

    def launch() -> subprocess.Popen[bytes]:
        outputs.append(tmp_path / f"launcher-{len(outputs)}.txt")
        return start_sweep(root, env, outputs[-1])

    launchers = [launch()]
    killed: list[str] = []
    plan = ["launcher", *HELPERS]  # each kind first, in a random order; then any
    rng.shuffle(plan)
    with cleaned_up(gates, launchers):
        for _ in range(FAULTS):
            held = gates.wait_held(2)  # both trials' jobs in flight
            launcher = launchers[-1]
            present = {"launcher": launcher.pid, **helpers_of(launcher.pid)}
            if killed[-2:] == ["tracking process"] * 2:
                del present["tracking process"]
            planned = [kind for kind in plan if kind in present]
            target = planned[0] if planned else rng.choice(sorted(present))
            if target in plan:
                plan.remove(target)
            gates.open([rng.choice(held)])
            os.kill(present[target], signal.SIGKILL)  # alive until now: the premise
            killed.append(target)
            if target == "launcher":
                launcher.wait()
                launchers.append(launch())
        with gates.all_open():
            code = launchers[-1].wait(timeout=300)
    said = outputs[-1].read_text()
    assert code == 0, said
    assert set(killed) == {"launcher", *HELPERS}, killed  # each kind was killed
    assert all(launcher.poll() is not None for launcher in launchers)
    for output in outputs:
        assert "Traceback" not in output.read_text(), output.read_text()

    trials = counted_trials(load_study(root).trials, at_most=killed.count("launcher"))
    assert [t.state.name for t in trials] == ["COMPLETE"] * CHAOS_TRIALS, said
    executions = Counter(float(json.loads(line)["x"]) for line in ledger.read_text().splitlines())
    assert executions == Counter(t.params["x"] for t in trials), "a job ran twice, or never"
    parents, children = sweep_runs(root)
    assert [p.info.status for p in parents] == ["FINISHED"]
    numbers = sorted(int(c.data.tags["paiexp.trial_number"]) for c in children)
    assert numbers == sorted(t.number for t in trials), "a trial has no run, or two"
    assert_series_whole(root, children)


def test_a_sigterm_to_the_launchers_process_group_ends_it_and_a_relaunch_completes(
    tmp_path: Path,
) -> None:
    """``timeout``, a shell's ``kill`` or a shutdown signal the launcher's whole process group:
    its tracking process (in a group of its own) closes the runs, the launcher leaves its
    running jobs to a later launch and exits (was: the tracking process died with the group
    and the launcher waited for it for ever)."""
    root = synthetic_project(
        tmp_path / "project",
        {"params": {"x": "interval(-3, 3)", "duration": 0.1, "steps": STEPS}, "n_trials": 4},
    )
    gates = Gates(tmp_path / "gates")
    env = clean_env(**gates.env())
    output = tmp_path / "launcher.txt"
    launcher = start_sweep(root, env, output, start_new_session=True)
    with cleaned_up(gates, [launcher]):
        held = gates.wait_held(2)
        assert tracking_process_of(launcher.pid) is not None
        os.killpg(launcher.pid, signal.SIGTERM)
        code = launcher.wait(timeout=60)
        said = output.read_text()
        assert code == 130, said
        assert "leaving running jobs to a later launch" in said and "died" not in said, said
        assert set(gates.held()) == set(held)  # its jobs run on
    with gates.all_open():
        again = subprocess.run(
            [sys.executable, "-m", "paiexp", "+sweep=syn"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert again.returncode == 0, again.stderr
    assert [t.state.name for t in load_study(root).trials] == ["COMPLETE"] * 4
