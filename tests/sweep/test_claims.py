"""Launchers racing on one study, each a process of its own released at once by a barrier,
on a journal file and on PostgreSQL: of those adopting one trial exactly one wins, and those
asking together make exactly the budget's trials."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from paiexp.sweep.budget import TrialBudget
from paiexp.sweep.claims import Claims, create_claims
from paiexp.sweep.ownership import study_storage, trial_id
from paiexp.sweep.records import OWNER

pytestmark = pytest.mark.slow

RACERS = 6
GONE = "host-x:1:1:gone"  # the owner the racers adopt from


def open_study(location: str) -> tuple[Any, Claims]:
    import optuna

    from paiexp.sweep.study import create_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="race", storage=create_storage(location), load_if_exists=True
    )
    storage, study_id = study_storage(study)
    return study, create_claims(storage, study_id, location)


def adopt(location: str, trial: int, barrier: Any, me: str) -> bool:
    """One launcher adopting ``trial``: whether it won."""
    _, claims = open_study(location)
    barrier.wait(60)
    return claims.claim(trial, GONE, me)


def ask(location: str, barrier: Any, budget: int, tries: int) -> int:
    """One launcher asking up to ``tries`` trials within ``budget``: how many it made."""
    study, claims = open_study(location)
    counted = TrialBudget(study, retries=0).counted
    barrier.wait(60)
    made = 0
    for _ in range(tries):
        with claims.exclusive() as acquired:
            if acquired and counted() < budget:
                study.ask()
                made += 1
    return made


def race(work: Callable[..., Any], args: tuple[Any, ...], each: list[tuple[Any, ...]]) -> list[Any]:
    """``work(*args, barrier, *each[n])`` in one process per racer, all at once; results."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(len(each), mp_context=context) as pool:
        barrier = manager.Barrier(len(each))
        futures = [pool.submit(work, *args, barrier, *extra) for extra in each]
        return [future.result(timeout=120) for future in futures]


@pytest.fixture(params=["journal", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "journal":
        return str(tmp_path / "optuna.journal")
    return str(request.getfixturevalue("postgres").database(f"race_{uuid.uuid4().hex[:8]}"))


def test_of_launchers_adopting_one_trial_exactly_one_wins(location: str) -> None:
    study, _ = open_study(location)
    trial = study.ask()
    trial.set_user_attr(OWNER, GONE)

    won = race(adopt, (location, trial_id(trial)), [(f"racer-{n}",) for n in range(RACERS)])
    assert sum(won) == 1, won
    winner = f"racer-{won.index(True)}"
    assert study.trials[0].user_attrs[OWNER] == winner


def test_launchers_asking_together_make_exactly_the_budget(location: str) -> None:
    open_study(location)

    made = race(ask, (location,), [(5, 3)] * RACERS)  # a budget of 5, each tries 3
    study, _ = open_study(location)
    assert sum(made) == 5 and len(study.trials) == 5, made
