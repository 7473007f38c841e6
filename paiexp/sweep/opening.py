"""Opening a sweep's study: created or loaded, checked against the sweep, points enqueued."""

from __future__ import annotations

import dataclasses
import secrets
from typing import TYPE_CHECKING, Any

from paiexp.errors import UserError
from paiexp.redact import redact_url
from paiexp.sweep.records import SWEEP_ID
from paiexp.sweep.study import create_pruner, create_sampler, create_storage

if TYPE_CHECKING:
    from optuna import Study

    from paiexp.sweep.launcher import PreparedSweep


def open_study(prepared: PreparedSweep) -> Study:
    """The sweep's study, with its ``paiexp:sweep_id`` set and ``sweep.enqueue`` queued.

    A study of that name optimizing other directions is a UserError: nothing is tracked yet.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep = prepared.sweep
    directions: list[Any] = [o.direction for o in prepared.objectives]
    try:
        study = optuna.create_study(
            storage=create_storage(prepared.storage),
            study_name=prepared.study_name,
            sampler=create_sampler(sweep.sampler),
            pruner=create_pruner(sweep.pruner),
            directions=directions,
            load_if_exists=True,
        )
    except ValueError as exc:
        raise UserError(
            f"sweep.study_name: study {prepared.study_name!r} in "
            f"{redact_url(prepared.storage)} does not fit this sweep: {exc}"
        ) from None
    existing = [d.name.lower() for d in study.directions]
    if existing != directions:
        raise UserError(
            f"sweep.objective: study {prepared.study_name!r} optimizes "
            f"{existing}, this sweep {directions}; use another sweep.study_name"
        )
    existing_trials = len(study.get_trials(deepcopy=False))
    if existing_trials and sweep.sampler.seed is not None:
        # A resumed, seeded sampler would replay the points its seed gave the first
        # trials; seeding it by the study's length keeps it reproducible and new.
        reseeded = dataclasses.replace(sweep.sampler, seed=sweep.sampler.seed + existing_trials)
        study.sampler = create_sampler(reseeded)
    if SWEEP_ID not in study.user_attrs:
        study.set_user_attr(SWEEP_ID, secrets.token_hex(4))
    for point in sweep.enqueue:
        study.enqueue_trial(dict(point), skip_if_exists=True)
    return study


def sweep_id(study: Study) -> str:
    return str(study.user_attrs[SWEEP_ID])
