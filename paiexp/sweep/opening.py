"""Opening a sweep's study: created or loaded, checked against the sweep, points enqueued.

Several launchers may open one study at once.  The storage lets exactly one of them create
it (study names are unique in a journal and in an RDB storage alike); that launcher draws the
study's sweep id and is its *leader* (``paiexp:leader``): the one that creates the sweep's
parent run, which the others wait for (see :mod:`paiexp.sweep.tracking_worker`).  A launcher
that finds the leader gone before any parent run was recorded leads in its place.
"""

from __future__ import annotations

import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paiexp.errors import UserError
from paiexp.sweep.ownership import heartbeat_interval
from paiexp.sweep.records import SWEEP_ID
from paiexp.sweep.study import create_pruner, create_sampler, create_storage, storage_outage
from paiexp.util.processes import process_alive
from paiexp.util.redact import redact_url

if TYPE_CHECKING:
    from optuna import Study

    from paiexp.sweep.prepared import PreparedSweep

# How long a launcher that did not create the study waits for its creator's sweep id (the
# creator writes it right after creating the study); then the study is taken to have been
# created outside paiexp, and its sweep id is claimed.
SWEEP_ID_WAIT_SECONDS = 5.0
# After claiming, how long before reading back which claim won (the last one written).
CLAIM_SETTLE_SECONDS = 0.5


LEADER_ATTR = "paiexp:leader"  # the launcher that creates the sweep's parent run
PARENT_RUN_ATTR = "paiexp:parent_run_id"  # the sweep's parent run, once created


@dataclass(frozen=True)
class OpenedStudy:
    study: Study
    sweep_id: str
    leader: bool  # this launch chose the sweep id: it creates the sweep's parent run


def open_study(
    prepared: PreparedSweep, owner: str, notify: Callable[[str], None] | None = None
) -> OpenedStudy:
    """The sweep's study, with its ``paiexp:sweep_id`` and ``sweep.enqueue`` queued;
    ``owner``: this launcher; ``notify``: tells the user of a database server's outages,
    which the study then rides out (see :mod:`paiexp.sweep.patient_storage`).

    A study of that name optimizing other directions is a UserError: nothing is tracked yet.
    """
    import optuna
    from optuna.exceptions import DuplicatedStudyError
    from optuna.study import StudyDirection

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep = prepared.sweep
    directions: list[Any] = [o.direction for o in prepared.objectives]
    outage = None
    if notify is not None:
        limit = sweep.storage_outage_timeout
        # once the server is back, each launcher beats again within a heartbeat's interval:
        # long before another, which counts silences anew after the outage, takes it for gone
        wait = heartbeat_interval(sweep.heartbeat_grace)
        outage = storage_outage(prepared.storage, limit, notify, longest_wait=wait)
    # built first: options they refuse are a UserError before the study's storage exists
    sampler, pruner = create_sampler(sweep.sampler), create_pruner(sweep.pruner)
    storage = create_storage(prepared.storage, outage)
    try:
        try:
            storage.create_new_study(
                [StudyDirection[d.upper()] for d in directions], prepared.study_name
            )
            created = True
        except DuplicatedStudyError:
            created = False
        study = optuna.load_study(
            study_name=prepared.study_name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
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
    if study.metric_names is None:  # the objectives' names, for whoever reads the study
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([o.metric for o in prepared.objectives])
    leader = _lead(study, created, owner)
    for point in sweep.enqueue:
        study.enqueue_trial(dict(point), skip_if_exists=True)
    return OpenedStudy(study, str(study.user_attrs[SWEEP_ID]), leader)


def _lead(study: Study, created: bool, owner: str) -> bool:
    """Give the study its sweep id if it has none; whether this launcher (``owner``) leads.

    The creator leads: it names itself leader, then sets the sweep id (so a launcher that
    sees the id sees its leader).  Another launcher waits for the id; when it never comes (a
    study created outside paiexp), every launcher still waiting claims one, and the last
    claim written, read back after a pause, leads.  A leader gone before any parent run was
    recorded is replaced by the launcher that finds it so.
    """
    if created:
        study.set_user_attr(LEADER_ATTR, owner)
        study.set_user_attr(SWEEP_ID, secrets.token_hex(4))
        return True
    deadline = time.monotonic() + SWEEP_ID_WAIT_SECONDS
    while SWEEP_ID not in study.user_attrs:
        if time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        claim = secrets.token_hex(4)
        study.set_user_attr(SWEEP_ID, claim)
        time.sleep(CLAIM_SETTLE_SECONDS)
        if study.user_attrs[SWEEP_ID] != claim:
            return False
        study.set_user_attr(LEADER_ATTR, owner)
        return True
    if _leader_gone(study, owner):
        study.set_user_attr(LEADER_ATTR, owner)
        return True
    return False


def _leader_gone(study: Study, owner: str) -> bool:
    """Whether the sweep has no parent run yet and the launcher to make it is gone."""
    attrs = study.user_attrs
    return PARENT_RUN_ATTR not in attrs and launcher_gone(attrs.get(LEADER_ATTR), owner)


def launcher_gone(launcher: str | None, owner: str) -> bool:
    """Whether ``launcher`` (``host:pid:start[:token]``) is gone, as ``owner`` can tell: none
    recorded, or one on the same host whose process is dead.  Another host's is taken to be
    alive."""
    if not launcher:
        return True
    fields = launcher.split(":")
    if fields[0] != owner.split(":")[0] or len(fields) < 3 or not fields[1].isdigit():
        return False
    return not process_alive(int(fields[1]), None if fields[2] == "None" else fields[2])
