"""A sweep of tests/synthetic/epochs.py whose first attempts are preempted from outside, and
the checks every backend's preemption test makes of it."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from conftest import clean_env
from sweep_helpers import children_by_trial, load_study, synthetic_project

import paiexp

EPOCHS = 4
HOLD = 2  # the first attempt checkpoints 2 epochs, starts the 3rd and is preempted in it
N_TRIALS = 3

EPOCHS_JOB = {
    "command": "python epochs.py",
    "hyperparameters": {"x": 0.0, "epochs": EPOCHS, "hold": HOLD},
    "outputs": {"ledger": None},
}


def epochs_project(root: Path) -> Path:
    sweep = {
        "params": {"x": "interval(-1, 1)"},
        "n_trials": N_TRIALS,
        "parallelism": 2,
        "retries": 1,
        "max_failures": 1,
    }
    return synthetic_project(root, sweep, EPOCHS_JOB)


def sweep_preempting(
    root: Path,
    overrides: list[str],
    held: Callable[[], Iterable[tuple[str, Path]]],
    preempt: Callable[[str, Path], None],
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the sweep; preempt each job once it says it is ``held`` (``held`` yields (key,
    ledger dir) pairs, ``preempt`` gets each key once): driven by the jobs' own files."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn", *overrides],
        cwd=root,
        env=env or clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    preempted: set[str] = set()
    try:
        while launcher.poll() is None:
            for key, ledger in held():
                if key not in preempted:
                    preempted.add(key)
                    preempt(key, ledger)
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.wait(timeout=0.05)
        out, err = launcher.communicate()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert len(preempted) == N_TRIALS, (preempted, err)
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, out, err)


def assert_resumed(
    root: Path, done: subprocess.CompletedProcess[str], ledgers: dict[str, Path], reason: str
) -> None:
    """Every trial completed after one preemption, none counts as failed, each point ran its
    epochs plus at most the one it lost, and its run names both attempts and why; each lost
    attempt shows as PREEMPTED (in its line and the summary), its run KILLED with the reason,
    naming the trial that carried its point on."""
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())  # the terminal's lines, as wrapped or not
    assert f"· {N_TRIALS} re-run ({N_TRIALS} preempted) ·" in said, done.stderr[-600:]
    assert not re.search(r"trial +\d+ FAIL", said), done.stderr
    attached = paiexp.attach_sweep("syn", project=root)  # as another process reads it
    assert attached.counts()["rerun"] == N_TRIALS == attached.counts()["preempted"]
    assert f"· {N_TRIALS} re-run ({N_TRIALS} preempted) ·" in attached.status()
    study = load_study(root)
    states = [(t.state.name, bool(t.user_attrs.get("paiexp:retried"))) for t in study.trials]
    assert sorted(states) == [("COMPLETE", False)] * N_TRIALS + [("FAIL", True)] * N_TRIALS
    runs = children_by_trial(root)
    reruns = {t.user_attrs.get("paiexp:retry_of"): t.number for t in study.trials}
    for trial in study.trials:
        if trial.state.name != "COMPLETE":  # preempted: shown so, its run KILLED, linked on
            assert reason in trial.user_attrs["paiexp:failure_reason"]
            assert trial.user_attrs["paiexp:preempted"] is True
            line = re.search(
                rf"trial +{trial.number} PREEMPTED (.*?) · re-run as trial (\d+)", said
            )
            assert line and reason in line.group(1), done.stderr
            assert int(line.group(2)) == reruns[trial.number]
            killed = runs[str(trial.number)]
            assert killed.info.status == "KILLED", killed.info
            assert reason in killed.data.tags["paiexp.failure_reason"]
            assert killed.data.tags["paiexp.preempted"] == "true"
            assert killed.data.tags["paiexp.rerun_trial"] == str(reruns[trial.number])
            continue
        assert trial.user_attrs.get("paiexp:preempted") is None
        first = study.trials[trial.user_attrs["paiexp:retry_of"]]
        jobs = [first.user_attrs["paiexp:job_name"], trial.user_attrs["paiexp:job_name"]]
        run = [
            ledger.joinpath("epochs").read_text().split()
            for job, ledger in ledgers.items()
            if job in jobs
        ]
        epochs = [int(e) for lines in run for e in lines]
        assert len(run) == 2 and sorted(set(epochs)) == list(range(1, EPOCHS + 1))
        assert EPOCHS <= len(epochs) <= EPOCHS + 1  # one preemption: at most one epoch lost
        tags = runs[str(trial.number)].data.tags
        assert tags["paiexp.attempt_jobs"] == ",".join(jobs)
        assert reason in tags["paiexp.attempts"] and float(tags["paiexp.time_lost_s"]) >= 0
