"""Crash-safe resume: a launcher SIGKILLed at random moments loses no trial, runs no job twice."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env, run_paiexp
from sweep_helpers import load_study, sweep_runs, synthetic_project

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("PAIEXP_RESUME_SEED", "20261122"))


def test_sigkilled_launcher_resumes_exactly(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)", "duration": "interval(2.0, 4.0)", "steps": 4},
            "n_trials": 12,
            "parallelism": 2,
        },
    )
    env = clean_env(LEDGER=str(ledger))
    rng = random.Random(SEED)
    kills = 0
    # 12 jobs of >= 2 s, 2 at a time, take >= 12 s: three launches of <= 4 s each cannot
    # finish the sweep on however fast a machine, so at least three are killed
    for _ in range(6):
        launcher = subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+sweep=syn"],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            launcher.wait(timeout=rng.uniform(1.0, 4.0))
            break  # it finished before this kill
        except subprocess.TimeoutExpired:
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()
            kills += 1
    final = run_paiexp(root, "+sweep=syn", env=env)
    assert final.returncode == 0, final.stderr
    assert kills >= 3, f"seed {SEED} killed the launcher only {kills} times"

    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 12, f"seed {SEED}"
    names = [t.user_attrs["paiexp:job_name"] for t in study.trials]
    assert len(set(names)) == 12
    lines = ledger.read_text().splitlines()
    assert len(lines) == 12 and len(set(lines)) == 12, f"seed {SEED}: jobs ran {len(lines)} times"
    assert {float(json.loads(line)["x"]) for line in lines} == {t.params["x"] for t in study.trials}
    parents, children = sweep_runs(root)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 12
    assert {c.info.status for c in children} == {"FINISHED"}
    assert sorted(int(c.data.tags["paiexp.trial_number"]) for c in children) == list(range(12))
    assert parents[0].data.metrics["best_score"] == study.best_value
    # every run, closed by whichever launch saw its job end, says what its job cost
    hours = [c.data.metrics.get("instance_hours") for c in children]
    assert all(h is not None and h > 0 for h in hours), hours
    assert parents[0].data.metrics["instance_hours"] == pytest.approx(sum(hours))
