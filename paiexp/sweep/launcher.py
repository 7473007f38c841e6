"""The asynchronous sweep launcher: Optuna ask/tell over backend jobs, crash-safe.

A sweep is checked whole before anything exists (:func:`~paiexp.sweep.prepared.prepare_sweep`),
then launched: its
study opened (:mod:`~paiexp.sweep.opening`), its parent run opened
(:mod:`~paiexp.sweep.parent_run`), and trials run by the loop (:mod:`~paiexp.sweep.scheduler`)
within the study's budget (:mod:`~paiexp.sweep.budget`), each trial's job and run handled by
:mod:`~paiexp.sweep.trial_jobs`, trials of launchers that are gone adopted
(:mod:`~paiexp.sweep.resume`).

``sweep.n_trials`` is the study's total: trials that ran (or run) count; a failed trial that
was re-run counts once, through its retry.
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from paiexp.sweep.budget import TrialBudget
from paiexp.sweep.opening import PARENT_RUN_ATTR, open_study
from paiexp.sweep.ownership import launcher_identity
from paiexp.sweep.parent_run import left_by_launchers_gone, parent_run, running_elsewhere
from paiexp.sweep.prepared import PreparedSweep, SweepOutcome
from paiexp.sweep.progress import Progress
from paiexp.sweep.resume import finished_before
from paiexp.sweep.scheduler import Scheduler
from paiexp.sweep.study_artifacts import load_when
from paiexp.sweep.tracker_protocol import TrackerFactory
from paiexp.sweep.tracking import SweepTracker
from paiexp.sweep.tracking_messages import Drawn, TrackingSetup
from paiexp.sweep.trial_jobs import TrialJobs

if TYPE_CHECKING:
    from optuna import Study

log = logging.getLogger(__name__)


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
        self.progress.say(prepared.projection.line())  # every check made: it will launch
        study, sweep = opened.study, opened.sweep_id
        # the command's tracking process, started ahead to load MLflow meanwhile, or a new one
        tracker = self.tracker_factory(tracking_setup(prepared, self.owner))
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
        # the plots' modules load from the first trial's end (its job's imports are done)
        loading = threading.Thread(target=load_when, args=(scheduler.trial_ended,), daemon=True)
        loading.start()
        with interrupts_to(scheduler), self.progress.live(scheduler):
            scheduler.run()
        jobs.publish_best()  # the study's best, even if a killed launch lost its last update
        interrupted = bool(scheduler.interrupts)
        with tempfile.TemporaryDirectory(prefix="paiexp-study-") as directory:
            # drawn here while the tracking process catches up (the last launcher's draw)
            last = not interrupted and not running_elsewhere(study, self.owner)
            drawn = draw(study, Path(directory)) if last else None
            tracker.finish_parent(interrupted=interrupted, launcher=self.owner, drawn=drawn)
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


def draw(study: Study, directory: Path) -> Drawn | None:
    """The study's trials table and plots, for the parent run; None if they could not be
    drawn here (the tracking process draws them, or says why it could not)."""
    from paiexp.sweep.study_artifacts import finished_trials, study_artifacts

    try:
        finished = finished_trials(study)
        return Drawn(tuple(study_artifacts(study, directory)), finished)
    except Exception as exc:  # a plot's bug, a full disk: never the sweep's end
        log.info("the study's plots were left to the tracking process: %s", exc)
        return None


def tracking_setup(prepared: PreparedSweep, launcher: str) -> TrackingSetup:
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
        launcher=launcher,
    )


@contextmanager
def interrupts_to(scheduler: Scheduler) -> Iterator[None]:
    """Ctrl-C interrupts the scheduler instead of raising, while the loop runs; so does a
    SIGTERM (``kill``, a shutdown, ``Sweep.stop(detach=True)``), leaving the running jobs to
    the next launch.  A sweep run in another thread, a pipeline's step, is interrupted by
    what runs the main thread."""

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        scheduler.interrupt(detach=signum == signal.SIGTERM)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_interrupt) if in_main else None
    terminated = signal.signal(signal.SIGTERM, on_interrupt) if in_main else None
    # The loop wakes briefly per event while the tracking worker runs long stretches of
    # Python (MLflow, plots): a short switch interval keeps the loop's latency low.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        yield
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, terminated)
        sys.setswitchinterval(switch_interval)
