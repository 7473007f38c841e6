"""One run per trial among the launchers sharing a study.

MLflow cannot make a tag unique, so two launchers may each make a run for one trial (the
launcher that asked for it, whose tracking lags, and the one that adopted it).  Each records
the run it made (or found) in the study's storage, in the step launchers take one at a time
(:meth:`paiexp.sweep.claims.Claims.exclusive`): the first run recorded is the trial's, and a
launcher whose own run came second deletes it.  Unlike keeping the oldest run, this holds
however long a launcher stalls between making its run and looking for others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paiexp.sweep.records import RUN

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from paiexp.sweep.claims import Claims


def elect(
    claims: Claims, storage: BaseStorage, study_id: int, identity: str, candidate: str
) -> str | None:
    """The run of ``identity`` (a parent run and a trial's job): the one recorded first in
    the study, ``candidate`` if none was (it is recorded now); None if the exclusive step
    could not be had (a launcher holding it was stopped)."""
    key = RUN + identity
    with claims.exclusive() as acquired:
        if not acquired:
            return None
        elected = storage.get_study_system_attrs(study_id).get(key)
        if elected is None:
            storage.set_study_system_attr(study_id, key, candidate)
            return candidate
        return str(elected)
