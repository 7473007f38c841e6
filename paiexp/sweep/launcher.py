"""The asynchronous sweep launcher: Optuna ask/tell over backend jobs, crash-safe.

A sweep is checked whole before anything exists (:func:`prepare_sweep`), then launched: its
study opened (:mod:`~paiexp.sweep.opening`), its parent run opened
(:mod:`~paiexp.sweep.parent_run`), and trials run by the loop (:mod:`~paiexp.sweep.scheduler`)
within the study's budget (:mod:`~paiexp.sweep.budget`), each trial's job and run handled by
:mod:`~paiexp.sweep.trial_jobs`, trials of launchers that are gone adopted
(:mod:`~paiexp.sweep.resume`).

``sweep.n_trials`` is the study's total: trials that ran (or run) count; a failed trial that
was re-run counts once, through its retry.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from paiexp.backends import Backend, create_backend
from paiexp.config import Config, SweepConfig
from paiexp.errors import UserError
from paiexp.record import SourceInfo, source_info
from paiexp.sweep.budget import TrialBudget
from paiexp.sweep.opening import PARENT_RUN_ATTR, open_study
from paiexp.sweep.ownership import launcher_identity
from paiexp.sweep.parent_run import left_by_launchers_gone, parent_run, running_elsewhere
from paiexp.sweep.progress import Progress
from paiexp.sweep.resume import finished_before
from paiexp.sweep.scheduler import Scheduler
from paiexp.sweep.space import SearchSpace, parse_space
from paiexp.sweep.study import (
    Objective,
    PruningSignal,
    check_sweep_settings,
    parse_objectives,
    storage_location,
)
from paiexp.sweep.tracker_protocol import TrackerFactory
from paiexp.sweep.tracking import SweepTracker
from paiexp.sweep.tracking_messages import BestRun, TrackingSetup
from paiexp.sweep.trial_jobs import TrialJobs
from paiexp.sweep.trials import TrialBuilder
from paiexp.tracking import check_tracking_server, tracking_uri

if TYPE_CHECKING:
    from optuna import Study


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
    if sweep.register is not None and len(objectives) > 1:
        raise UserError(
            "sweep.register: a multi-objective study has no one best trial to register; "
            "set sweep.register null"
        )
    sampled = {name for name in space.params if name not in space.fixed()}
    for index, point in enumerate(sweep.enqueue):
        unknown = set(point) - sampled
        if unknown:
            raise UserError(
                f"sweep.enqueue[{index}]: {sorted(unknown)[0]!r} is not a searched "
                f"parameter; searched: {', '.join(sorted(sampled))}"
            )
    if config.tracker.outage_timeout <= 0:
        raise UserError(
            f"tracker.outage_timeout: must be > 0 seconds, got {config.tracker.outage_timeout}"
        )
    check_tracking_server(tracking_uri(config.tracker.uri))  # last: it asks the network
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
class SweepOutcome:
    study: Study
    stop_reason: str | None
    failed: bool  # stopped by failures (max_failures, tracking), not by its budget
    interrupted: bool
    tracker_uri: str | None
    tracking_errors: list[str]
    experiment_id: str | None = None
    registered: str | None = None  # sweep.register's outcome
    best: BestRun | None = None  # the best trial's run and model, as MLflow has them

    @property
    def completed(self) -> bool:
        """Whether any trial of the study completed (a sweep without one failed)."""
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


class Launcher:
    """Runs a prepared sweep to its end (or interruption) and closes its tracking."""

    def __init__(
        self,
        prepared: PreparedSweep,
        progress: Progress,
        tracker_factory: TrackerFactory = SweepTracker,
    ) -> None:
        self.prepared = prepared
        self.progress = progress
        self.tracker_factory = tracker_factory
        self.identity = launcher_identity()
        self.owner = str(self.identity)

    def run(self) -> SweepOutcome:
        prepared = self.prepared
        prepared.backend.set_concurrency(prepared.sweep.parallelism)
        # may still reject the sweep: before anything is tracked
        opened = open_study(prepared, self.owner, self.progress.say)
        study, sweep = opened.study, opened.sweep_id
        tracker = self.tracker_factory(tracking_setup(prepared))
        tracker.notify = self.progress.say
        parent = parent_run(prepared, prepared.backend.name)
        # MLflow opens in the tracking process while trials run
        known_run = study.user_attrs.get(PARENT_RUN_ATTR)
        tracker.open_parent(
            sweep, known_run, parent.create, parent.invocation, leader=opened.leader
        )
        budget = TrialBudget(study, prepared.sweep.retries)
        jobs = TrialJobs(prepared, study, sweep, budget, tracker, self.progress, self.identity)
        tracker.reconcile(left_by_launchers_gone(study, finished_before(jobs), self.owner))
        scheduler = Scheduler(
            jobs, budget, prepared.sweep, prepared.pruning, tracker, self.progress
        )
        with interrupts_to(scheduler), self.progress.live(scheduler):
            scheduler.run()
        jobs.publish_best()  # the study's best, even if a killed launch lost its last update
        tracker.finish_parent(
            interrupted=bool(scheduler.interrupts),
            close=not running_elsewhere(study, self.owner),
        )
        uri = tracker.close()
        if tracker.disk_full:  # the last calls found the disk full: the next launch writes them
            raise tracker.disk_full
        jobs.label_runs()  # the runs created last
        return SweepOutcome(
            study,
            scheduler.stop_reason,
            scheduler.stop_failed,
            bool(scheduler.interrupts),
            uri,
            tracker.errors,
            tracker.experiment_id,
            tracker.registered,
            tracker.best,
        )


def tracking_setup(prepared: PreparedSweep) -> TrackingSetup:
    config = prepared.config
    return TrackingSetup(
        tracker_uri=config.tracker.uri,
        experiment=config.tracker.experiment,
        storage=prepared.storage,
        study_name=prepared.study_name,
        backend=config.backend,
        base_dir=prepared.base_dir,
        overrides=prepared.overrides,
        source=prepared.source,
        register=prepared.sweep.register,
        objective=prepared.objectives[0].metric,
        outage_timeout=config.tracker.outage_timeout,
        storage_outage_timeout=prepared.sweep.storage_outage_timeout,
        heartbeat_grace=prepared.sweep.heartbeat_grace,
    )


@contextmanager
def interrupts_to(scheduler: Scheduler) -> Iterator[None]:
    """Ctrl-C interrupts the scheduler instead of raising, while the loop runs (a sweep run
    in another thread, a pipeline's step, is interrupted by what runs the main thread)."""

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        scheduler.interrupt()

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_interrupt) if in_main else None
    # The loop wakes briefly per event while the tracking worker runs long stretches of
    # Python (MLflow, plots): a short switch interval keeps the loop's latency low.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        yield
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
        sys.setswitchinterval(switch_interval)
