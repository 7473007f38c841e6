"""Each trial's job and run: asked for, submitted (or found again), told how it ended.

A trial records its owner (claimed, see :mod:`paiexp.sweep.ownership`), then its job's name
before the job exists and the job's id once it is submitted (see :mod:`paiexp.sweep.records`):
a launcher that dies in between leaves enough for the next one to find the job again, or to
submit it under the same name.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paiexp.backends import JobHandle, JobRejected, JobStatus
from paiexp.config.spec import JobSpec
from paiexp.contract.layout import TRIAL_VARIABLE
from paiexp.errors import UserError
from paiexp.sweep import attempts, spending
from paiexp.sweep.ownership import Identity, Lease, trial_id
from paiexp.sweep.progress import best_of, rank, ranking
from paiexp.sweep.records import (
    JOB_ID,
    JOB_NAME,
    PREEMPTED,
    PRUNING,
    REASON,
    REASON_LIMIT,
    RETRIED,
    job_name,
)
from paiexp.sweep.space import SearchSpace
from paiexp.sweep.tracking_messages import TrialRecord
from paiexp.sweep.trials import HYPERPARAMETERS
from paiexp.tracking.cost import RunCost, most, run_cost
from paiexp.tracking.mlflow_tracker import TRIAL_STATE_TO_RUN_STATUS
from paiexp.tracking.monitor import JobMonitor, JobResult, job_log
from paiexp.util.diskfull import disk_full

if TYPE_CHECKING:
    from optuna import Study, Trial
    from optuna.trial import FrozenTrial, TrialState

    from paiexp.sweep.budget import TrialBudget
    from paiexp.sweep.prepared import PreparedSweep
    from paiexp.sweep.progress import Progress
    from paiexp.sweep.tracker_protocol import Tracker

log = logging.getLogger(__name__)


@dataclass(eq=False)  # one per job: ``in`` and ``remove`` compare identities, not fields
class InFlight:
    """A trial whose job runs."""

    trial: Trial
    spec: JobSpec
    handle: JobHandle
    monitor: JobMonitor
    pruning: bool = False  # the pruner condemned it; its job is being stopped
    interrupted: bool = False  # the sweep was interrupted; its job is being stopped
    reported: set[int] = field(default_factory=set)  # steps reported to the pruner
    submitted: float = field(default_factory=time.time)  # when submitted (or re-attached to)


class TrialJobs:
    def __init__(
        self,
        prepared: PreparedSweep,
        study: Study,
        sweep_id: str,
        budget: TrialBudget,
        tracker: Tracker,
        progress: Progress,
        owner: Identity,
    ) -> None:
        self.study = study
        self.sweep_id = sweep_id
        self.budget = budget
        self.tracker = tracker
        self.progress = progress
        self.lease = Lease(study, prepared.storage, owner, prepared.sweep.heartbeat_grace)
        self.lease.beat()
        self.backend = prepared.backend
        self.builder = prepared.trials
        self.study_name = prepared.study_name
        self.base_dir = prepared.base_dir
        self.n_trials = prepared.sweep.n_trials
        self.objectives = prepared.objectives
        self.distributions = prepared.space.distributions()
        self.extend_trial = prepared.extend_trial
        self.prices = prepared.prices
        self.limit = prepared.budget  # sweep.max_cost / max_instance_hours
        self.unlabelled: dict[str, JobHandle] = {}  # jobs not yet told their run's id
        self.refused: str | None = None  # why the platform refuses this sweep's jobs
        self.blocked = False  # the last start could not ask (see start)
        self.published: tuple[int, ...] = ()  # the best trial(s) the parent run was told
        self.best_key: tuple[float, int] | None = None  # one objective: the best published's rank
        self.shared = False  # another launcher has followed the study (its heartbeat seen)

    def job_name(self, number: int) -> str:
        return job_name(self.study_name, self.sweep_id, number)

    def spec(
        self, params: dict[str, Any], number: int, name: str, checkpoints: str | None = None
    ) -> JobSpec:
        """The trial's job; a UserError when the schema rejects a swept value.
        ``checkpoints``: those of the lost job it re-runs, to start from."""
        spec = self.builder.spec(params, name)
        labels = {"paiexp-study": self.study_name, "paiexp-trial": str(number)}
        spec = dataclasses.replace(
            spec,
            labels={**spec.labels, **labels},
            environments={**spec.environments, TRIAL_VARIABLE: str(number)},
        )
        return dataclasses.replace(spec, checkpoints=checkpoints) if checkpoints else spec

    def record(self, params: dict[str, Any], spec: JobSpec) -> TrialRecord:
        return TrialRecord(spec, self.builder.data(params))

    def start(self) -> InFlight | None:
        """Ask for a new trial and launch it; None if it may not ask now (``blocked`` then
        says so: the budget is spent, perhaps by another launcher's last trial, or another
        launcher holds the study's lock), or if the trial ended at once (failed)."""
        from optuna.exceptions import UpdateFinishedTrialError

        with self.lease.claims.exclusive() as acquired:  # launchers count and ask in turn
            self.blocked = not acquired or self.budget.counted() >= self.n_trials
            if self.blocked:
                return None
            try:
                trial = self.study.ask(self.distributions)
            except UpdateFinishedTrialError:  # this launcher was silent (stopped) mid-ask
                self.progress.say(
                    "a trial this launcher was asking for was finished by another while it "
                    "was silent; left to it"
                )
                return None
            if not self.lease.claim(trial_id(trial), None):
                return None  # adopted first: only by a launcher that found it ownerless long
        if self.extend_trial is not None:
            try:
                self.extend_trial(trial)
            except Exception as exc:  # the user's search-space code: this trial cannot run
                self.fail(trial, f"the custom search space failed: {type(exc).__name__}: {exc}")
                return None
        return self.launch(trial, name=self.job_name(trial.number))

    def launch(
        self, trial: Trial, *, adopted: FrozenTrial | None = None, name: str | None = None
    ) -> InFlight | None:
        """Submit (or find again) the trial's job and have its child run created; None if
        the trial failed instead, or if another launcher finished it while this one was silent
        (stopped, cut off) in the middle of launching it: it adopted the trial, and its job
        (one per name) with it.  ``adopted``: the trial as a launcher that is gone left it;
        ``name``: a new trial's job name, recorded first."""
        from optuna.exceptions import UpdateFinishedTrialError

        try:
            if name is not None:
                trial.set_user_attr(JOB_NAME, name)
            return self._launch(trial, adopted)
        except UpdateFinishedTrialError:
            self.progress.say(
                f"trial {trial.number}: finished by another launcher while this one was "
                "silent; left to it"
            )
            return None

    def _launch(self, trial: Trial, adopted: FrozenTrial | None) -> InFlight | None:
        name = str(trial.user_attrs[JOB_NAME])
        try:
            spec = self.spec(trial.params, trial.number, name, attempts.checkpoints(trial))
        except UserError as exc:  # a swept value the schema rejects: this trial cannot run
            self.fail(trial, str(exc))
            return None
        try:
            handle = self.backend.submit(spec)
        except JobRejected as exc:  # this job cannot run here; other points may
            self.start_child(trial, spec, adopted=adopted is not None)
            self.fail(trial, f"job rejected: {exc}", job_name=name)
            return None
        except UserError as exc:  # the platform refused the job: the next would fare no better
            self.start_child(trial, spec, adopted=adopted is not None)
            self.fail(trial, f"submission rejected: {exc}", job_name=name)
            self.refused = f"submission rejected: {exc}"
            return None
        except (OSError, RuntimeError) as exc:
            if disk_full(exc):
                raise  # no trial can start: the launcher stops, and this one runs next launch
            self.start_child(trial, spec, adopted=adopted is not None)
            self.fail(trial, f"submission failed: {exc}", job_name=name, infrastructure=True)
            return None
        trial.set_user_attr(JOB_ID, handle.id)
        bound = most(spec.instance_type, spec.instance_count, spec.max_run_time, self.prices)
        if bound is not None:
            self.record_cost(trial, bound, spent=False)
        self.start_child(trial, spec, adopted=adopted is not None)
        self.unlabelled[name] = handle
        log_path = job_log(self.base_dir, name)
        monitor = JobMonitor(self.backend, handle, spec, log_path)
        flight = InFlight(trial, spec, handle, monitor)
        if adopted is not None:
            flight.reported = set(adopted.intermediate_values)
            flight.pruning = bool(adopted.user_attrs.get(PRUNING))
        self.progress.started(trial.number)
        return flight

    def start_child(self, trial: Trial, spec: JobSpec, *, adopted: bool) -> None:
        params = dict(trial.params)
        tags = {
            "mlflow.runName": f"trial-{trial.number}",
            "paiexp.trial_number": str(trial.number),
            "paiexp.sweep_id": self.sweep_id,
            "optuna.params": str({k: str(v) for k, v in params.items()}),
        }
        job_id = trial.user_attrs.get(JOB_ID)  # none when its job was never submitted
        if job_id:
            tags["paiexp.job_id"] = str(job_id)
        tags.update(attempts.tags(trial, spec.name))
        record = self.record(params, spec)
        self.tracker.start_child(spec.name, record, tags, adopted=adopted, shared=self.shared)

    def label_runs(self) -> None:
        """Label each job with its MLflow run's id once the tracking process has made it."""
        run_ids = self.tracker.run_ids
        for name in [n for n in self.unlabelled if n in run_ids]:
            self.backend.label(self.unlabelled.pop(name), {"paiexp-run": run_ids[name]})

    def log_points(self, flights: Iterable[InFlight]) -> None:
        """The new metric points of jobs in flight, on their trials' runs, in one call.  A
        trial whose run the tracking process has not made yet keeps its points for a later
        call, or its finish: a start still queued can still be joined with its finish."""
        run_ids = self.tracker.run_ids
        points = {
            flight.spec.name: flight.monitor.take_unlogged()
            for flight in flights
            if flight.monitor.unlogged and flight.spec.name in run_ids
        }
        if points:
            self.tracker.log_points(points)

    def tell(
        self,
        flight: InFlight,
        state: TrialState,
        *,
        result: JobResult,
        values: list[float] | None = None,
        reason: str | None = None,
        rerun: bool = False,
        preempted: bool = False,
        detail: str | None = None,
    ) -> None:
        """Finish the trial of a job that ended, and its run; unless another launcher (that
        took the trial over while this one was silent) finished it first: its run is its own.
        ``preempted`` (with ``rerun``): the platform took the job away; the trial shows as
        PREEMPTED and its run ends KILLED, naming the trial that carries the point on.
        ``detail``: what the terminal shows after the reason (the log's last line)."""
        from optuna.exceptions import UpdateFinishedTrialError

        trial = flight.trial
        result.cost = self.cost(flight, result.status)
        self.progress.spend(result.cost)
        preempted = preempted and rerun
        tags = {"paiexp.trial_state": state.name}
        try:
            self.record_cost(trial, result.cost, spent=True)
            if reason:
                trial.set_user_attr(REASON, reason[:REASON_LIMIT])
            if preempted:
                trial.set_user_attr(PREEMPTED, True)
            if rerun:
                carried = attempts.carried(
                    trial, flight.spec.name, reason or "", lost(flight, result), result.outputs
                )
                again = self.budget.retry(
                    trial, consume_attempt=not flight.interrupted, carried=carried
                )
                if again is not None:
                    tags["paiexp.rerun_trial"] = str(again)
            self.study.tell(trial, values or None, state=state)
        except (UpdateFinishedTrialError, ValueError):
            if not self.study.get_trials(deepcopy=False)[trial.number].state.is_finished():
                raise  # a ValueError of its own
            self.progress.say(f"trial {trial.number}: finished by another launcher; left to it")
            return
        if preempted:
            tags["paiexp.preempted"] = "true"
        self.tracker.finish_child(
            flight.spec.name,
            result,
            flight.monitor.take_unlogged(),
            "KILLED" if preempted else TRIAL_STATE_TO_RUN_STATUS[state.name],
            reason,
            tags,
        )
        retried = bool(trial.user_attrs.get(RETRIED))
        shown = f"{reason.splitlines()[0]} · {detail}" if reason and detail else reason
        if retried and "paiexp.rerun_trial" in tags:
            shown = f"{shown} · re-run as trial {tags['paiexp.rerun_trial']}"
        self.progress.finished(
            trial.number, state.name, values, shown, retried=retried, preempted=preempted
        )
        for warning in result.warnings:
            log.warning("trial %d: %s", trial.number, warning)
        if values and self.improves(trial.number, values):
            self.publish_best(changed_only=True)

    def cost(self, flight: InFlight, status: JobStatus) -> RunCost:
        """What a trial's job cost: from its start to its end as the backend says, else from
        its submission to now (the end the launcher sees)."""
        spec = flight.spec
        started = status.started_at or flight.submitted
        ended = status.ended_at or time.time()
        cost = run_cost(spec.instance_type, spec.instance_count, started, ended, self.prices)
        assert cost is not None
        return cost

    def record_cost(self, trial: Trial, cost: RunCost, *, spent: bool) -> None:
        attrs: dict[str, object] = {}
        spending.record(attrs, cost, spent=spent)
        for key, value in attrs.items():
            trial.set_user_attr(key, value)

    def improves(self, number: int, values: list[float]) -> bool:
        """Whether trial ``number``'s objective values may change the best: a better value, or
        the best value of an earlier trial, as :func:`~paiexp.sweep.progress.ranking` ranks
        them (it reads every complete trial: per tell, that would grow with the study); other
        launchers' better trials are published once per heartbeat interval (see
        :class:`~paiexp.sweep.scheduler.Scheduler`)."""
        if len(self.objectives) > 1 or self.best_key is None:
            return True
        return rank(self.objectives[0], values[0], number) < self.best_key

    def fail(
        self,
        trial: Trial,
        reason: str,
        *,
        job_name: str | None = None,
        infrastructure: bool = False,
    ) -> None:
        """Fail a trial whose job never ran (or was lost), and its run if it has one.
        ``infrastructure``: the platform's fault, so the point is re-run within retries."""
        from optuna.trial import TrialState

        trial.set_user_attr(REASON, reason[:REASON_LIMIT])
        if infrastructure and self.budget.may_retry(trial):
            job = job_name or str(trial.user_attrs.get(JOB_NAME, ""))
            self.budget.retry(trial, carried=attempts.carried(trial, job, reason, 0.0, {}))
        self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        if job_name:
            self.tracker.fail_child(job_name, reason)
        retried = bool(trial.user_attrs.get(RETRIED))
        self.progress.finished(trial.number, "FAIL", None, reason, retried=retried)

    def publish_best(self, *, changed_only: bool = False) -> None:
        """The best value (or Pareto front) so far, on the terminal and on the parent run;
        with ``changed_only``, on the parent run only if it changed."""
        from optuna.trial import TrialState

        complete = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            return
        best = best_of(self.study, self.objectives, complete)
        self.progress.show_best(best)
        numbers = tuple(t.number for t in best)
        if changed_only and numbers == self.published:
            return
        self.published = numbers
        metrics: dict[str, float] = {}
        best_job: str | None = None
        if len(self.objectives) == 1:
            self.best_key = ranking(self.objectives[0])(best[0])
            metrics[f"best_{self.objectives[0].metric}"] = float(best[0].values[0])
            tags = {
                "paiexp.best_trial": str(best[0].number),
                "paiexp.best_value": repr(best[0].values[0]),
            }
            tags.update({f"paiexp.best.{_key(k)}": str(v) for k, v in best[0].params.items()})
            best_job = best[0].user_attrs.get(JOB_NAME)
        else:
            metrics["pareto_front_size"] = float(len(best))
            tags = {"paiexp.best_trials": ",".join(str(t.number) for t in best)}
        self.tracker.update_best(metrics, len(complete), tags, best_job)


def _key(param: str) -> str:
    """A parameter's name as MLflow keys take it: its config key's (``+w``: ``w``)."""
    return SearchSpace.config_key(param).removeprefix(HYPERPARAMETERS)


def lost(flight: InFlight, result: JobResult) -> float:
    """Seconds a job that ended ran: from its start to its end where the platform says,
    else from its submission (or re-attachment) until now."""
    status = result.status
    if status.started_at is not None and status.ended_at is not None:
        return max(0.0, status.ended_at - status.started_at)
    return max(0.0, time.time() - flight.submitted)
