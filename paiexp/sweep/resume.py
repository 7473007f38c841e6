"""Resuming a study: trials a launcher that is gone left RUNNING, and runs a crash left open.

A trial left RUNNING whose owner is gone is adopted: a trial without a job id is submitted
again under the same name (submission is idempotent by name, so no job is created twice); a
trial whose job is found is followed from its log's start; a trial whose submitted job is
lost fails and, within ``sweep.retries``, is re-run.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from paiexp.errors import UserError
from paiexp.processes import process_alive
from paiexp.sweep.records import JOB_ID, JOB_NAME, OWNER, REASON
from paiexp.sweep.tracking_messages import FinishedTrial
from paiexp.sweep.trial_jobs import InFlight, TrialJobs

if TYPE_CHECKING:
    from optuna import Study, Trial
    from optuna.trial import FrozenTrial

    from paiexp.sweep.progress import Progress


def adopt_running_trials(jobs: TrialJobs, progress: Progress) -> list[InFlight]:
    """Take over trials left RUNNING by a launcher that is gone; returns their jobs."""
    from optuna.trial import TrialState

    flights = []
    for frozen in jobs.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not orphaned(frozen):
            continue
        trial = reopen(jobs.study, frozen)
        trial.set_user_attr(OWNER, jobs.owner)
        name = frozen.user_attrs.get(JOB_NAME) or jobs.job_name(frozen.number)
        trial.set_user_attr(JOB_NAME, name)
        if JOB_ID in frozen.user_attrs and jobs.backend.find(name) is None:
            spec = jobs.spec(trial.params, trial.number, name)
            jobs.start_child(trial, spec, adopted=True)
            reason = f"job {name} was lost (not found after a restart)"
            jobs.fail(trial, reason, job_name=name, infrastructure=True)
            continue
        progress.say(f"trial {frozen.number}: re-attaching to job {name}")
        flight = jobs.launch(trial, adopted=frozen)
        if flight is not None:
            flights.append(flight)
    return flights


def reopen(study: Study, frozen: FrozenTrial) -> Trial:
    """A live handle on a RUNNING trial another launcher asked for, to report to and tell.

    Optuna 5 has no public way from a FrozenTrial to its Trial (``Study.tell`` takes a trial
    number, but ``report``/``should_prune``/``set_user_attr`` need a Trial, whose constructor
    takes the storage's trial id): the one use of its private ``_trial_id``.
    """
    from optuna.trial import Trial

    return Trial(study, frozen._trial_id)


def orphaned(frozen: FrozenTrial) -> bool:
    """Whether the launcher that owns this RUNNING trial is gone (on this machine)."""
    owner = str(frozen.user_attrs.get(OWNER, ""))
    if not owner:
        return True
    host, _, rest = owner.partition(":")
    if host != socket.gethostname():
        return False  # another machine's launcher: its own to finish
    pid, _, start = rest.partition(":")
    return not process_alive(int(pid), start)


def finished_before(jobs: TrialJobs) -> list[FinishedTrial]:
    """Trials that had finished before this launch, for the tracker to check that each has a
    closed run (a crash may have dropped the calls queued for it)."""
    trials = []
    for trial in jobs.study.get_trials(deepcopy=False):
        name = trial.user_attrs.get(JOB_NAME)
        if not trial.state.is_finished() or name is None:
            continue
        try:
            spec = jobs.spec(trial.params, trial.number, name)
        except UserError:
            continue  # a trial the schema rejected never had a run
        trials.append(
            FinishedTrial(
                job_name=name,
                number=trial.number,
                state=trial.state.name,
                reason=trial.user_attrs.get(REASON),
                record=jobs.record(trial.params, spec),
                tags={
                    "paiexp.trial_number": str(trial.number),
                    "paiexp.sweep_id": jobs.sweep_id,
                },
            )
        )
    return trials
