"""The asynchronous sweep launcher: Optuna ask/tell over backend jobs, crash-safe.

One loop serves every in-flight job: one ``poll`` call for all their statuses, new log lines
read from each job's cursor, intermediate values reported to Optuna and pruned jobs stopped,
and the moment a job ends its trial is told and the next one asked for.

What makes it resumable, per trial, in the study storage (user attributes):

- ``paiexp:job_name`` (deterministic from the study and the trial number) before anything
  exists outside the storage; ``paiexp:run_id`` once its MLflow child run exists;
  ``paiexp:job_id`` once its job is submitted.
- Restarted, the launcher adopts trials still RUNNING whose launcher is gone: a trial without
  a job id is submitted again under the same name (submission is idempotent by name, so a
  job is never created twice); a trial whose job is found is followed from its log's start;
  a trial whose submitted job is lost fails and, within ``sweep.retries``, is re-run.
- ``sweep.n_trials`` is the study's total: trials that ran (or run) count; a failed trial
  that was re-run counts once, through its retry.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from omegaconf import DictConfig

from paiexp.backends import (
    Backend,
    BackendUnavailable,
    JobHandle,
    JobState,
    JobStatus,
    create_backend,
)
from paiexp.config import Config, SweepConfig
from paiexp.errors import UserError
from paiexp.metrics import MetricPoint
from paiexp.monitor import JobMonitor, JobResult
from paiexp.processes import process_alive, process_start_time
from paiexp.record import SourceInfo, source_info
from paiexp.redact import redact_url
from paiexp.spec import JobSpec
from paiexp.sweep.progress import Progress
from paiexp.sweep.space import SearchSpace, parse_space
from paiexp.sweep.study import (
    Objective,
    PruningSignal,
    check_sweep_settings,
    create_pruner,
    create_sampler,
    create_storage,
    parse_objectives,
    storage_location,
)
from paiexp.sweep.tracking import (
    PARENT_RUN_ATTR,
    TRIAL_STATE_TO_RUN_STATUS,
    SweepTracker,
    TrackingSetup,
    TrialRecord,
)
from paiexp.sweep.trials import TrialBuilder

JOB_NAME = "paiexp:job_name"
JOB_ID = "paiexp:job_id"
OWNER = "paiexp:owner"
REASON = "paiexp:failure_reason"
RETRIED = "paiexp:retried"
ATTEMPT = "paiexp:attempt"
PRUNING = "paiexp:pruning"
SWEEP_ID = "paiexp:sweep_id"


@dataclass(frozen=True)
class PreparedSweep:
    """A validated sweep: nothing has been created yet."""

    config: Config
    sweep: SweepConfig
    space: SearchSpace
    trials: TrialBuilder
    objectives: list[Objective]
    pruning: PruningSignal | None
    storage: str
    study_name: str
    backend: Backend
    base_dir: Path
    overrides: tuple[str, ...]
    source: SourceInfo | None


def prepare_sweep(
    cfg: DictConfig, config: Config, base_dir: Path, overrides: tuple[str, ...]
) -> PreparedSweep:
    """Check everything a user can get wrong in a sweep, before any trial exists."""
    sweep = config.sweep
    assert sweep is not None
    space = parse_space(sweep.params)
    backend = create_backend(config.backend, base_dir)
    trials = TrialBuilder(cfg, space, base_dir)
    probe = trials.spec(space.first_point(), "validate")
    backend.validate(probe)
    objectives = parse_objectives(sweep.objective, probe.metric_definitions)
    pruning = check_sweep_settings(sweep, objectives, probe.metric_definitions)
    sampled = {name for name in space.params if name not in space.fixed()}
    for index, point in enumerate(sweep.enqueue):
        unknown = set(point) - sampled
        if unknown:
            raise UserError(
                f"sweep.enqueue[{index}]: {sorted(unknown)[0]!r} is not a searched "
                f"parameter; searched: {', '.join(sorted(sampled))}"
            )
    return PreparedSweep(
        config=config,
        sweep=sweep,
        space=space,
        trials=trials,
        objectives=objectives,
        pruning=pruning,
        storage=storage_location(sweep.storage, base_dir),
        study_name=sweep.study_name or sweep.name,
        backend=backend,
        base_dir=base_dir,
        overrides=overrides,
        source=source_info(probe.source_dir),
    )


@dataclass
class InFlight:
    trial: Any  # optuna.Trial
    spec: JobSpec
    handle: JobHandle
    monitor: JobMonitor
    pruning: bool = False
    interrupted: bool = False
    reported: set[int] = field(default_factory=set)


@dataclass
class SweepOutcome:
    study: Any
    stop_reason: str | None
    failed: bool  # stopped by failures (max_failures, tracking), not by its budget
    interrupted: bool
    tracker_uri: str | None
    tracking_errors: list[str]


class Launcher:
    def __init__(self, prepared: PreparedSweep, progress: Progress) -> None:
        self.p = prepared
        self.backend = prepared.backend
        self.progress = progress
        self.inflight: list[InFlight] = []
        self.unlabelled: dict[str, JobHandle] = {}  # jobs not yet told their run's id
        self.stop_reason: str | None = None
        self.stop_failed = False
        self.interrupts = 0
        self.started = time.monotonic()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{process_start_time(os.getpid())}"
        self.log_root = prepared.base_dir / ".paiexp" / "logs"

    # -- set-up ----------------------------------------------------------------------------

    def open_study(self) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        directions: list[Any] = [o.direction for o in self.p.objectives]
        try:
            self.study = optuna.create_study(
                storage=create_storage(self.p.storage),
                study_name=self.p.study_name,
                sampler=create_sampler(self.p.sweep.sampler),
                pruner=create_pruner(self.p.sweep.pruner),
                directions=directions,
                load_if_exists=True,
            )
        except ValueError as exc:
            raise UserError(
                f"sweep.study_name: study {self.p.study_name!r} in "
                f"{redact_url(self.p.storage)} does not fit this sweep: {exc}"
            ) from None
        existing = [d.name.lower() for d in self.study.directions]
        if existing != directions:
            raise UserError(
                f"sweep.objective: study {self.p.study_name!r} optimizes "
                f"{existing}, this sweep {directions}; use another sweep.study_name"
            )
        existing_trials = len(self.study.get_trials(deepcopy=False))
        if existing_trials and self.p.sweep.sampler.seed is not None:
            # A resumed, seeded sampler would replay the points its seed gave the first
            # trials; seeding it by the study's length keeps it reproducible and new.
            reseeded = dataclasses.replace(
                self.p.sweep.sampler, seed=self.p.sweep.sampler.seed + existing_trials
            )
            self.study.sampler = create_sampler(reseeded)
        attrs = self.study.user_attrs
        if SWEEP_ID not in attrs:
            self.study.set_user_attr(SWEEP_ID, secrets.token_hex(4))
        self.sweep_id = str(self.study.user_attrs[SWEEP_ID])
        self.distributions = self.p.space.distributions()
        for point in self.p.sweep.enqueue:
            self.study.enqueue_trial(dict(point), skip_if_exists=True)

    def open_parent_run(self) -> None:
        sweep = self.p.sweep
        invocation = {
            "paiexp.n_trials": str(sweep.n_trials),
            "paiexp.parallelism": str(sweep.parallelism),
            "paiexp.timeout": str(sweep.timeout),
            "paiexp.backend": self.backend.name,
            "paiexp.storage": redact_url(self.p.storage),
            "paiexp.study_name": self.p.study_name,
        }
        pruned_metric = self.p.pruning.metric if self.p.pruning else "-"
        params: dict[str, Any] = {
            "sweep.name": sweep.name,
            "sweep.objective": ", ".join(f"{o.metric} ({o.direction})" for o in self.p.objectives),
            "sweep.sampler": f"{sweep.sampler.name} seed={sweep.sampler.seed} "
            f"{dict(sweep.sampler.options)}",
            "sweep.pruner": f"{sweep.pruner.name} on {pruned_metric} {dict(sweep.pruner.options)}",
            "sweep.storage": redact_url(self.p.storage),
            "sweep.study_name": self.p.study_name,
        }
        params.update({f"space.{n}": p.describe() for n, p in self.p.space.params.items()})
        self.tracking.open_parent(
            self.sweep_id,
            self.study.user_attrs.get(PARENT_RUN_ATTR),
            {"study_name": self.p.study_name, "tags": invocation, "params": params},
            invocation,
        )

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> SweepOutcome:
        self.backend.set_concurrency(self.p.sweep.parallelism)
        self.open_study()  # may still reject the sweep: before anything is tracked
        p = self.p
        self.tracking = SweepTracker(
            TrackingSetup(
                tracker_uri=p.config.tracker.uri,
                experiment=p.config.tracker.experiment,
                storage=p.storage,
                study_name=p.study_name,
                backend=p.config.backend,
                base_dir=p.base_dir,
                overrides=p.overrides,
                source=p.source,
            )
        )
        self.open_parent_run()  # MLflow opens in the tracking process while trials run
        self.tracking.reconcile(self.finished_before())
        self.adopt_running_trials()
        previous = signal.signal(signal.SIGINT, self._on_interrupt)
        # The loop wakes briefly per event while the tracking worker runs long stretches of
        # Python (MLflow, plots): a short switch interval keeps the loop's latency low.
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        try:
            with self.progress.live(self):
                self.loop()
        finally:
            signal.signal(signal.SIGINT, previous)
            sys.setswitchinterval(switch_interval)
        self.publish_best()  # the study's best, even if a killed launch lost its last update
        self.tracking.finish_parent(interrupted=bool(self.interrupts))
        uri = self.tracking.close()
        self.label_runs()  # the runs created last
        return SweepOutcome(
            self.study,
            self.stop_reason,
            self.stop_failed,
            bool(self.interrupts),
            uri,
            self.tracking.errors,
        )

    def loop(self) -> None:
        while True:
            if self.interrupts:
                if self.p.sweep.on_interrupt == "detach":
                    return  # trials stay RUNNING; the next launch re-attaches to their jobs
                for flight in self.inflight:
                    if not flight.interrupted:
                        flight.interrupted = True
                        self.backend.stop(flight.handle)
            while self.can_submit():
                self.start_trial()
            if not self.inflight:
                return
            self.label_runs()
            try:
                statuses = self.backend.poll([f.handle for f in self.inflight])
            except BackendUnavailable as exc:  # the jobs run on regardless: ask again later
                self.progress.say(f"backend unavailable, polling again: {exc}")
                self.backend.wait([f.handle for f in self.inflight], self.backend.poll_interval)
                continue
            for flight in list(self.inflight):
                status = statuses[flight.handle.id]
                points = flight.monitor.pull(final=status.state.terminal)
                if status.state.terminal:
                    self.inflight.remove(flight)
                    self.complete(flight, status)
                elif points:
                    self.observe(flight, points)
            self.progress.refresh()
            if self.inflight and not self.slot_free():
                self.backend.wait([f.handle for f in self.inflight], self.backend.poll_interval)

    def label_runs(self) -> None:
        """Label each job with its MLflow run's id once the tracking process has made it."""
        run_ids = self.tracking.run_ids
        for name in [n for n in self.unlabelled if n in run_ids]:
            self.backend.label(self.unlabelled.pop(name), {"paiexp-run": run_ids[name]})

    def slot_free(self) -> bool:
        return len(self.inflight) < self.p.sweep.parallelism and self.can_submit()

    def can_submit(self) -> bool:
        if self.stop_reason or len(self.inflight) >= self.p.sweep.parallelism:
            return False
        sweep = self.p.sweep
        if self.interrupts:
            self.stop_reason = "interrupted"
        elif self.tracking.fatal:
            self.stop_reason = f"MLflow tracking failed: {self.tracking.fatal}"
            self.stop_failed = True
        elif sweep.timeout is not None and time.monotonic() - self.started > sweep.timeout:
            self.stop_reason = f"sweep.timeout of {sweep.timeout:g} s reached"
        elif sweep.max_failures is not None and self.failures() >= sweep.max_failures:
            self.stop_reason = (
                f"{self.failures()} trials failed (sweep.max_failures="
                f"{sweep.max_failures}); see their failure reasons"
            )
            self.stop_failed = True
        return not self.stop_reason and self.trials_counted() < sweep.n_trials

    def trials_counted(self) -> int:
        """Trials toward n_trials: running or finished; a re-run failure counts via its retry."""
        from optuna.trial import TrialState

        return sum(
            1
            for t in self.study.get_trials(deepcopy=False)
            if t.state is not TrialState.WAITING and not _retried(t)
        )

    def failures(self) -> int:
        from optuna.trial import TrialState

        return sum(
            1
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
            if not _retried(t)
        )

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.interrupts += 1
        if self.interrupts > 1:
            raise KeyboardInterrupt  # a second Ctrl-C: leave at once; the study resumes
        self.progress.say(
            "interrupted: no new trials; "
            + (
                "stopping running jobs"
                if self.p.sweep.on_interrupt == "stop"
                else "leaving running jobs to a later launch"
            )
            + " (Ctrl-C again to exit at once)"
        )

    # -- one trial -------------------------------------------------------------------------

    def job_name(self, number: int) -> str:
        slug = "".join(c if c.isalnum() else "-" for c in self.p.study_name.lower()).strip("-")
        slug = (slug or "sweep")[:24].rstrip("-")
        if not slug[0].isalpha():
            slug = f"s{slug}"[:24]
        return f"{slug}-{self.sweep_id[:6]}-t{number:04d}"

    def start_trial(self) -> None:
        trial = self.study.ask(self.distributions)
        trial.set_user_attr(OWNER, self.owner)
        trial.set_user_attr(JOB_NAME, self.job_name(trial.number))
        self.launch(trial)

    def trial_spec(self, params: dict[str, Any], number: int, name: str) -> JobSpec:
        spec = self.p.trials.spec(params, name)
        labels = {"paiexp-study": self.p.study_name, "paiexp-trial": str(number)}
        return dataclasses.replace(spec, labels={**spec.labels, **labels})

    def start_child(self, trial: Any, spec: JobSpec, *, adopted: bool = False) -> None:
        params = dict(trial.params)
        tags = {
            "mlflow.runName": f"trial-{trial.number}",
            "paiexp.trial_number": str(trial.number),
            "paiexp.sweep_id": self.sweep_id,
            "optuna.params": str({k: str(v) for k, v in params.items()}),
        }
        record = TrialRecord(spec, self.p.trials.data(params))
        self.tracking.start_child(spec.name, record, tags, adopted=adopted)

    def launch(self, trial: Any, *, adopted: Any = None) -> None:
        """Submit (or find again) the trial's job, and have its child run created.

        ``adopted`` is the frozen trial when taking over from a launcher that is gone.
        """
        name = trial.user_attrs[JOB_NAME]
        try:
            spec = self.trial_spec(trial.params, trial.number, name)
        except UserError as exc:  # a swept value the schema rejects: this trial cannot run
            self.fail(trial, str(exc))
            return
        try:
            handle = self.backend.submit(spec)
        except UserError as exc:  # the platform refused the job: the next would fare no better
            self.start_child(trial, spec, adopted=adopted is not None)
            self.fail(trial, f"submission rejected: {exc}", job_name=name)
            self.stop_reason, self.stop_failed = f"submission rejected: {exc}", True
            return
        except (OSError, RuntimeError) as exc:
            self.start_child(trial, spec, adopted=adopted is not None)
            self.fail(trial, f"submission failed: {exc}", job_name=name, infrastructure=True)
            return
        trial.set_user_attr(JOB_ID, handle.id)
        self.start_child(trial, spec, adopted=adopted is not None)
        self.unlabelled[name] = handle
        monitor = JobMonitor(self.backend, handle, spec, self.log_root / f"{name}.log")
        flight = InFlight(trial, spec, handle, monitor)
        if adopted is not None:
            flight.reported = set(adopted.intermediate_values)
            flight.pruning = bool(adopted.user_attrs.get(PRUNING))
        self.inflight.append(flight)
        self.progress.started(trial.number)

    def observe(self, flight: InFlight, points: list[MetricPoint]) -> None:
        """Report the pruning metric's new steps; stop the job when Optuna says prune."""
        signal_ = self.p.pruning
        if signal_ is None or flight.pruning or flight.interrupted:
            return
        reported = False
        for point in points:
            if point.name == signal_.metric and point.step not in flight.reported:
                flight.trial.report(signal_.sign * point.value, point.step)
                flight.reported.add(point.step)
                reported = True
        if reported and flight.trial.should_prune():
            flight.pruning = True
            flight.trial.set_user_attr(PRUNING, True)
            self.backend.stop(flight.handle)

    def complete(self, flight: InFlight, status: JobStatus) -> None:
        from optuna.trial import TrialState

        result = flight.monitor.result(status)
        if flight.pruning:
            self.tell(flight, TrialState.PRUNED, result=result)
        elif status.state is JobState.SUCCEEDED:
            values, problem = self.objective_values(flight.spec, result)
            if problem:
                self.tell(flight, TrialState.FAIL, result=result, reason=problem)
            else:
                self.tell(flight, TrialState.COMPLETE, result=result, values=values)
        elif flight.interrupted:
            self.tell(
                flight,
                TrialState.FAIL,
                result=result,
                reason="interrupted: the sweep was stopped",
                rerun=True,
            )
        else:
            reason = status.reason or f"job {status.state.value.lower()}"
            rerun = status.infrastructure and self.may_retry(flight.trial)
            self.tell(flight, TrialState.FAIL, result=result, reason=reason, rerun=rerun)

    def objective_values(self, spec: JobSpec, result: JobResult) -> tuple[list[float], str | None]:
        regexes = {d.name: d.regex for d in spec.metric_definitions}
        values = []
        for objective in self.p.objectives:
            value = result.metrics.get(objective.metric)
            if value is None:
                tail = "\n".join(result.log_tail[-10:])
                return [], (
                    f"objective metric {objective.metric!r} never matched regex "
                    f"{regexes.get(objective.metric)!r}; log tail:\n{tail}"
                )
            if math.isnan(value):
                return [], f"objective metric {objective.metric!r} is NaN"
            values.append(value)
        return values, None

    def may_retry(self, trial: Any) -> bool:
        return int(trial.user_attrs.get(ATTEMPT, 0)) < self.p.sweep.retries

    def tell(
        self,
        flight: InFlight,
        state: Any,
        *,
        result: JobResult,
        values: list[float] | None = None,
        reason: str | None = None,
        rerun: bool = False,
    ) -> None:
        trial = flight.trial
        if reason:
            trial.set_user_attr(REASON, reason[:2000])
        if rerun:
            self.retry(trial, consume_attempt=not flight.interrupted)
        self.study.tell(trial, values if values else None, state=state, skip_if_finished=True)
        status = TRIAL_STATE_TO_RUN_STATUS[state.name]
        unlogged = flight.monitor.take_unlogged()
        self.tracking.finish_child(
            flight.spec.name, result, unlogged, status, reason, {"paiexp.trial_state": state.name}
        )
        self.progress.finished(trial.number, state.name, values, reason)
        self.publish_best()

    def fail(
        self, trial: Any, reason: str, *, job_name: str | None = None, infrastructure: bool = False
    ) -> None:
        """Fail a trial whose job never ran (or was lost); its run, if any, is failed too."""
        from optuna.trial import TrialState

        trial.set_user_attr(REASON, reason[:2000])
        if infrastructure and self.may_retry(trial):
            self.retry(trial)
        self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        if job_name:
            self.tracking.fail_child(job_name, reason)
        self.progress.finished(trial.number, "FAIL", None, reason)

    def retry(self, trial: Any, *, consume_attempt: bool = True) -> None:
        """Enqueue the same parameters again; this trial then does not count toward n_trials."""
        trial.set_user_attr(RETRIED, True)
        attempt = int(trial.user_attrs.get(ATTEMPT, 0)) + int(consume_attempt)
        self.study.enqueue_trial(
            dict(trial.params), user_attrs={ATTEMPT: attempt, "paiexp:retry_of": trial.number}
        )

    def publish_best(self) -> None:
        from optuna.trial import TrialState

        complete = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            return
        metrics: dict[str, float] = {}
        tags: dict[str, str] = {}
        best_job: str | None = None
        if len(self.p.objectives) == 1:
            best = self.study.best_trial
            metric = self.p.objectives[0].metric
            metrics[f"best_{metric}"] = float(best.values[0])
            tags = {"paiexp.best_trial": str(best.number), "paiexp.best_value": repr(best.value)}
            tags.update({f"paiexp.best.{k}": str(v) for k, v in best.params.items()})
            best_job = best.user_attrs.get(JOB_NAME)
        else:
            front = self.study.best_trials
            metrics["pareto_front_size"] = float(len(front))
            tags = {"paiexp.best_trials": ",".join(str(t.number) for t in front)}
        self.progress.best(self.study)
        self.tracking.update_best(metrics, len(complete), tags, best_job)

    # -- resume ----------------------------------------------------------------------------

    def adopt_running_trials(self) -> None:
        """Take over trials left RUNNING by a launcher that is gone."""
        import optuna
        from optuna.trial import TrialState

        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not self._orphaned(frozen):
                continue
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            trial.set_user_attr(OWNER, self.owner)
            name = frozen.user_attrs.get(JOB_NAME) or self.job_name(frozen.number)
            trial.set_user_attr(JOB_NAME, name)
            if JOB_ID in frozen.user_attrs and self.backend.find(name) is None:
                spec = self.trial_spec(trial.params, trial.number, name)
                self.start_child(trial, spec, adopted=True)
                self.fail(
                    trial,
                    f"job {name} was lost (not found after a restart)",
                    job_name=name,
                    infrastructure=True,
                )
                continue
            self.progress.say(f"trial {frozen.number}: re-attaching to job {name}")
            self.launch(trial, adopted=frozen)

    def _orphaned(self, frozen: Any) -> bool:
        owner = str(frozen.user_attrs.get(OWNER, ""))
        host, _, rest = owner.partition(":")
        if not owner:
            return True
        if host != socket.gethostname():
            return False  # another machine's launcher: its own to finish
        pid, _, start = rest.partition(":")
        return not process_alive(int(pid), start)

    def finished_before(self) -> list[dict[str, Any]]:
        """Trials that had finished before this launch, for the tracking process to check
        that each has a closed run (a crash may have dropped the calls queued for it)."""
        trials = []
        for trial in self.study.get_trials(deepcopy=False):
            name = trial.user_attrs.get(JOB_NAME)
            if not trial.state.is_finished() or name is None:
                continue
            try:
                spec = self.trial_spec(trial.params, trial.number, name)
            except UserError:
                continue  # a trial the schema rejected never had a run
            trials.append(
                {
                    "job_name": name,
                    "number": trial.number,
                    "state": trial.state.name,
                    "reason": trial.user_attrs.get(REASON),
                    "record": TrialRecord(spec, self.p.trials.data(trial.params)),
                    "tags": {
                        "paiexp.trial_number": str(trial.number),
                        "paiexp.sweep_id": self.sweep_id,
                    },
                }
            )
        return trials


def _retried(trial: Any) -> bool:
    return bool(trial.user_attrs.get(RETRIED))
