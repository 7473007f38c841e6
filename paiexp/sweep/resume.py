"""Adopting trials whose launcher is gone, and closing runs a crash left open.

A RUNNING trial is adopted when its owner is gone (see :mod:`paiexp.sweep.ownership`: dead on
this host, or silent for the grace period), or when it has a job name but no owner (an older
paiexp, or a hand, left it: every launcher names itself before naming the job).  A trial
asked by a launcher that died before claiming it stays ownerless; it is adopted once it has
been so for the grace period (failed, and counted no more, if that launcher died before all
its parameters were drawn).  The adopter claims it first, atomically, so that one launcher
adopts each.  Then a trial without a job id is submitted again under the same name
(submission is idempotent by name, so no job is created twice); a trial whose job is found is
followed from its log's start; a trial whose submitted job is lost fails and, within
``sweep.retries``, is re-run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paiexp.errors import UserError
from paiexp.sweep import attempts
from paiexp.sweep.ownership import Watch, dead_here, this_host, trial_id
from paiexp.sweep.records import JOB_ID, JOB_NAME, OWNER, REASON, RETRIED
from paiexp.sweep.spending import trial_cost
from paiexp.sweep.tracking_messages import FinishedTrial
from paiexp.sweep.trial_jobs import InFlight, TrialJobs

if TYPE_CHECKING:
    from optuna import Study, Trial
    from optuna.trial import FrozenTrial

    from paiexp.sweep.progress import Progress


class Adopter:
    """Watches the other launchers' RUNNING trials; claims and follows those of one gone."""

    def __init__(self, jobs: TrialJobs, progress: Progress) -> None:
        self.jobs = jobs
        self.progress = progress
        self.watch = Watch(jobs.lease.identity, jobs.lease.grace)
        self.outages = 0  # the storage outages the watch has counted silences after
        # trials other launchers follow that this one waits for at the end (all but those
        # of a live launcher on this host, which finishes them): number -> owner
        self.others: dict[int, str | None] = {}

    def check(self) -> list[InFlight]:
        """Adopt the trials whose launcher is gone; returns their jobs to follow."""
        from optuna.trial import TrialState

        lease = self.jobs.lease
        heartbeats = lease.heartbeats()
        self.jobs.shared = self.jobs.shared or any(o != lease.owner for o in heartbeats)
        if lease.outages() != self.outages:  # nobody could heartbeat: silences start anew
            self.outages = lease.outages()
            self.watch.restart()
        self.others = {}
        flights = []
        for frozen in self.jobs.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = frozen.user_attrs.get(OWNER)
            if owner == lease.owner:
                continue
            if not self._gone(frozen, owner, heartbeats):
                if owner is None or dead_here(owner, self.watch.host) is None:
                    self.others[frozen.number] = owner
                continue
            if lease.claim(trial_id(frozen), owner):  # else another launcher was first
                flight = self._adopt(frozen, owner)
                if flight is not None:
                    flights.append(flight)
        return flights

    def _gone(self, frozen: FrozenTrial, owner: str | None, heartbeats: dict[str, Any]) -> bool:
        if owner is None:
            return JOB_NAME in frozen.user_attrs or self.watch.silent(f"#{frozen.number}", None)
        return self.watch.gone(owner, heartbeats)

    def _adopt(self, frozen: FrozenTrial, owner: str | None) -> InFlight | None:
        jobs = self.jobs
        trial = reopen(jobs.study, frozen)
        if owner is None and set(frozen.params) < set(jobs.distributions):
            trial.set_user_attr(RETRIED, True)  # it never ran: it counts no more
            jobs.fail(trial, "its launcher ended while asking for it, before it had a job")
            return None
        name = frozen.user_attrs.get(JOB_NAME) or jobs.job_name(frozen.number)
        trial.set_user_attr(JOB_NAME, name)
        if JOB_ID in frozen.user_attrs and jobs.backend.find(name) is None:
            spec = jobs.spec(trial.params, trial.number, name, attempts.checkpoints(trial))
            jobs.start_child(trial, spec, adopted=True)
            reason = f"job {name} was lost (not found after a restart)"
            jobs.fail(trial, reason, job_name=name, infrastructure=True)
            return None
        self.progress.say(
            f"trial {frozen.number}: its launcher {owner or '(none recorded)'} is gone; "
            f"re-attaching to job {name}"
        )
        return jobs.launch(trial, adopted=frozen)


def orphaned(frozen: FrozenTrial) -> bool:
    """Whether the launcher of this trial is known at once to be gone: none is recorded, or
    it ran on this host and its process is dead (one on another host may be alive)."""
    owner = frozen.user_attrs.get(OWNER)
    return not owner or dead_here(str(owner), this_host()) is True


def reopen(study: Study, frozen: FrozenTrial) -> Trial:
    """A live handle on a RUNNING trial another launcher asked for, to report to and tell.

    Optuna 5 has no public way from a FrozenTrial to its Trial (``Study.tell`` takes a trial
    number, but ``report``/``should_prune``/``set_user_attr`` need a Trial, whose constructor
    takes the storage's trial id).
    """
    from optuna.trial import Trial

    return Trial(study, trial_id(frozen))


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
        tags = {"paiexp.trial_number": str(trial.number), "paiexp.sweep_id": jobs.sweep_id}
        if trial.user_attrs.get(JOB_ID):
            tags["paiexp.job_id"] = str(trial.user_attrs[JOB_ID])
        trials.append(
            FinishedTrial(
                job_name=name,
                number=trial.number,
                state=trial.state.name,
                reason=trial.user_attrs.get(REASON),
                record=jobs.record(trial.params, spec),
                tags=tags,
                cost=trial_cost(trial),
            )
        )
    return trials
