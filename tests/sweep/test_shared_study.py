"""Several launchers sharing one study: one parent run, one child run per trial, no point twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import clean_env
from gates import Gates
from optuna.distributions import FloatDistribution, IntDistribution
from sweep_helpers import load_study, sweep_runs, synthetic_project

from paiexp.config.schema import SamplerConfig
from paiexp.sweep.records import OWNER
from paiexp.sweep.study import create_sampler, create_storage

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

LAUNCHERS = 3
PARALLELISM = 2
N_TRIALS = 12
SPACE = {"x": FloatDistribution(-3, 3, step=0.001), "n": IntDistribution(0, 1000)}
SEEDED = ["tpe", "random", "nsgaii", "nsgaiii", "bruteforce"]  # cmaes, gp: need cmaes, torch


def points(journal: Path, name: str, launchers: int, trials: int) -> list[tuple[float, int]]:
    """The points ``launchers`` launchers with the same seeded sampler ask, in turn, of one
    study (each told at once)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = create_storage(str(journal))
    optuna.create_study(study_name="s", storage=storage)
    studies = [
        optuna.load_study(
            study_name="s", storage=storage, sampler=create_sampler(SamplerConfig(name, seed=7))
        )
        for _ in range(launchers)
    ]
    asked = []
    for number in range(trials):
        study = studies[number % launchers]
        trial = study.ask(SPACE)
        study.tell(trial, trial.params["x"] ** 2 + trial.params["n"] / 1000)
        asked.append((trial.params["x"], trial.params["n"]))
    return asked


@pytest.mark.parametrize("name", SEEDED)
def test_launchers_with_one_seed_propose_points_of_their_own(tmp_path: Path, name: str) -> None:
    shared = points(tmp_path / "shared.journal", name, launchers=3, trials=12)
    assert len(set(shared)) == 12, shared
    # One launcher's sweep is reproducible from its seed (each trial's point from its number).
    alone = points(tmp_path / "one.journal", name, launchers=1, trials=6)
    assert points(tmp_path / "again.journal", name, launchers=1, trials=6) == alone


@pytest.mark.timeout(240)
def test_launchers_started_together_share_the_study_and_its_runs(tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-3, 3)", "duration": 0.1},
            "n_trials": N_TRIALS,
            "parallelism": PARALLELISM,
            "sampler": {"name": "tpe", "seed": 7},  # the same seed in every launcher
        },
    )
    ledger = tmp_path / "ledger.txt"
    gates = Gates(tmp_path / "gates")
    env = clean_env(LEDGER=str(ledger), **gates.env())
    launchers = [
        subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+sweep=syn"],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(LAUNCHERS)
    ]
    # no job ends before every launcher has asked for both its trials: they ask together
    gates.wait_held(LAUNCHERS * PARALLELISM)
    owners = {t.user_attrs[OWNER] for t in load_study(root).trials}
    assert len(owners) == LAUNCHERS, owners
    with gates.all_open():
        for launcher in launchers:
            _, stderr = launcher.communicate(timeout=200)
            assert launcher.returncode == 0, stderr

    assert len(ledger.read_text().splitlines()) == N_TRIALS  # one execution per trial
    trials = load_study(root).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * N_TRIALS
    assert len({t.params["x"] for t in trials}) == N_TRIALS, "a point was proposed twice"
    parents, children = sweep_runs(root)
    assert len(parents) == 1, [p.info.run_id for p in parents]
    parent = parents[0].info.run_id
    assert [c.data.tags["mlflow.parentRunId"] for c in children] == [parent] * N_TRIALS
    numbers = sorted(int(c.data.tags["paiexp.trial_number"]) for c in children)
    assert numbers == list(range(N_TRIALS))
    assert {c.info.status for c in children} == {"FINISHED"}
    assert parents[0].info.status == "FINISHED"  # closed by the last launcher to finish
    best = [
        c.data.tags["paiexp.trial_number"]
        for c in children
        if c.data.tags.get("paiexp.best") == "true"
    ]
    assert best == [str(load_study(root).best_trial.number)]
