"""The trial budget: which trials count toward ``sweep.n_trials``, which failed, which re-run.

A failed trial that is re-run (its parameters enqueued again) is marked ``paiexp:retried``
and counts no more: its retry counts in its place, so ``n_trials`` is the study's total of
distinct points however often the platform lost their jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from paiexp.sweep.records import ATTEMPT, RETRIED, RETRY_OF

if TYPE_CHECKING:
    from optuna import Study, Trial
    from optuna.trial import FrozenTrial


class TrialBudget:
    def __init__(self, study: Study, retries: int) -> None:
        self.study = study
        self.retries = retries

    def counted(self) -> int:
        """Trials toward n_trials: running or finished; a re-run failure counts via its retry
        (only FAIL trials are ever marked re-run)."""
        from optuna.trial import TrialState

        states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
        return sum(  # one read of the study (each syncs a journal): every tick counts it
            1
            for t in self.study.get_trials(deepcopy=False)
            if t.state in states or (t.state is TrialState.FAIL and not retried(t))
        )

    def failures(self) -> int:
        """Failed trials that were not re-run."""
        from optuna.trial import TrialState

        failed = self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        return sum(1 for t in failed if not retried(t))

    def may_retry(self, trial: Trial) -> bool:
        """Whether a trial failed for a platform reason has attempts left."""
        return int(trial.user_attrs.get(ATTEMPT, 0)) < self.retries

    def retry(
        self,
        trial: Trial,
        *,
        consume_attempt: bool = True,
        carried: Mapping[str, Any] | None = None,
    ) -> int | None:
        """Enqueue the trial's parameters again; the trial then no longer counts.  Returns the
        re-run's trial number.

        An interrupted trial is re-run without using up an attempt: no platform failed it.
        ``carried``: user attributes the re-run starts with (its earlier attempts, the
        checkpoints to resume from; see :mod:`paiexp.sweep.attempts`).
        """
        trial.set_user_attr(RETRIED, True)
        attempt = int(trial.user_attrs.get(ATTEMPT, 0)) + int(consume_attempt)
        attrs = {**(carried or {}), ATTEMPT: attempt, RETRY_OF: trial.number}
        self.study.enqueue_trial(dict(trial.params), user_attrs=attrs)
        return rerun_of(self.study, trial.number)


def rerun_of(study: Study, number: int) -> int | None:
    """The newest trial that re-runs trial ``number``'s point."""
    for trial in reversed(study.get_trials(deepcopy=False)):
        if trial.user_attrs.get(RETRY_OF) == number:
            return trial.number
    return None


def retried(trial: FrozenTrial) -> bool:
    return bool(trial.user_attrs.get(RETRIED))
