"""What the launcher needs of a sweep's tracker: its verbs, each one typed call.

:class:`Tracker` turns every verb into one message of :mod:`paiexp.sweep.tracking_messages`
and hands it to :meth:`Tracker.send`: :class:`paiexp.sweep.tracking.SweepTracker` sends it to
the tracking process, a test's fake records it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from paiexp.sweep.tracking_messages import (
    BestRun,
    Call,
    Drawn,
    FailChild,
    FinishChild,
    FinishedTrial,
    FinishParent,
    LogPoints,
    NewParentRun,
    OpenParent,
    Reconcile,
    StartChild,
    TrackingSetup,
    TrialRecord,
    UpdateBest,
)

if TYPE_CHECKING:
    from paiexp.metrics.extraction import MetricPoint
    from paiexp.tracking.monitor import JobResult
    from paiexp.util.diskfull import DiskFull

log = logging.getLogger(__name__)


class Tracker(ABC):
    """A sweep's tracker. ``fatal`` says when tracking cannot work (the launcher then stops
    submitting); ``run_ids`` maps a job's name to its trial's run, for the runs made so far;
    ``notify`` tells the user what the tracking has to say (by default, a logged warning)."""

    def __init__(self) -> None:
        self.notify: Callable[[str], None] = _warn
        self._fatal: str | None = None
        self._disk_full: DiskFull | None = None
        self._run_ids: dict[str, str] = {}
        self.experiment_id: str | None = None  # once closed: the runs' MLflow experiment
        self.registered: str | None = None  # once closed: what sweep.register did
        self.best: BestRun | None = None  # once closed: the best trial's run and model
        self.errors: list[str] = []

    @abstractmethod
    def send(self, call: Call) -> None:
        """Hand one call on, in order."""

    @abstractmethod
    def close(self) -> str | None:
        """Wait until every call is done; returns the tracking URI, if it opened."""

    @abstractmethod
    def take_replies(self) -> None:
        """Take what the tracking answered so far (runs created, calls failed)."""

    @property
    def fatal(self) -> str | None:
        self.take_replies()
        return self._fatal

    @property
    def disk_full(self) -> DiskFull | None:
        """The full disk that stopped the tracking, if one did."""
        self.take_replies()
        return self._disk_full

    @property
    def run_ids(self) -> dict[str, str]:
        self.take_replies()
        return self._run_ids

    def open_parent(
        self,
        sweep_id: str,
        known_run_id: str | None,
        create: Mapping[str, Any],
        invocation: Mapping[str, str],
        *,
        leader: bool = True,
    ) -> None:
        """``create``: the new parent run's ``study_name`` (its name), ``tags`` and ``params``;
        ``leader``: this launcher chose the sweep id, so it creates the parent run."""
        new = NewParentRun(
            run_name=str(create["study_name"]),
            tags=dict(create["tags"]),
            params={key: str(value) for key, value in create["params"].items()},
        )
        self.send(OpenParent(sweep_id, known_run_id, leader, new, dict(invocation)))

    def reconcile(self, trials: Iterable[FinishedTrial]) -> None:
        """Trials that finished before this launch: each gets a closed run."""
        self.send(Reconcile(tuple(trials)))

    def start_child(
        self,
        job_name: str,
        record: TrialRecord,
        tags: Mapping[str, str],
        *,
        adopted: bool = False,
        shared: bool = False,
    ) -> None:
        self.send(StartChild(job_name, record, dict(tags), adopted, shared))

    def finish_child(
        self,
        job_name: str,
        result: JobResult,
        unlogged: list[MetricPoint],
        status: str,
        reason: str | None,
        tags: Mapping[str, str],
    ) -> None:
        self.send(FinishChild(job_name, result, tuple(unlogged), status, reason, dict(tags)))

    def log_points(self, points: Mapping[str, Sequence[MetricPoint]]) -> None:
        """Running trials' new points, by job name, on their runs: one call for all."""
        self.send(LogPoints({name: tuple(series) for name, series in points.items()}))

    def fail_child(self, job_name: str, reason: str) -> None:
        self.send(FailChild(job_name, reason))

    def update_best(
        self, metrics: Mapping[str, float], step: int, tags: Mapping[str, str], best_job: str | None
    ) -> None:
        self.send(UpdateBest(dict(metrics), step, dict(tags), best_job))

    def finish_parent(
        self, *, interrupted: bool, launcher: str | None = None, drawn: Drawn | None = None
    ) -> None:
        self.send(FinishParent(interrupted, launcher, drawn))


def _warn(text: str) -> None:
    log.warning("%s", text)


TrackerFactory = Callable[[TrackingSetup], Tracker]
