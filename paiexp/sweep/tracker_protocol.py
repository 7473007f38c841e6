"""What the launcher needs of a sweep's tracker (``SweepTracker``, or a test's fake)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from paiexp.metrics import MetricPoint
    from paiexp.monitor import JobResult
    from paiexp.sweep.tracking_messages import FinishedTrial, TrackingSetup, TrialRecord


class Tracker(Protocol):
    errors: list[str]

    @property
    def fatal(self) -> str | None:
        """Why tracking cannot work, if it cannot (the sweep then stops submitting)."""

    @property
    def run_ids(self) -> dict[str, str]:
        """Job name -> the id of its trial's run, for the runs created so far."""

    def open_parent(
        self,
        sweep_id: str,
        known_run_id: str | None,
        create: Mapping[str, Any],
        invocation: Mapping[str, str],
    ) -> None: ...

    def reconcile(self, trials: Iterable[FinishedTrial]) -> None: ...

    def start_child(
        self, job_name: str, record: TrialRecord, tags: Mapping[str, str], *, adopted: bool = False
    ) -> None: ...

    def finish_child(
        self,
        job_name: str,
        result: JobResult,
        unlogged: list[MetricPoint],
        status: str,
        reason: str | None,
        tags: Mapping[str, str],
    ) -> None: ...

    def fail_child(self, job_name: str, reason: str) -> None: ...

    def update_best(
        self, metrics: Mapping[str, float], step: int, tags: Mapping[str, str], best_job: str | None
    ) -> None: ...

    def finish_parent(self, *, interrupted: bool) -> None: ...

    def close(self) -> str | None:
        """Wait until every call is done; returns the tracking URI, if it opened."""


TrackerFactory = Callable[["TrackingSetup"], Tracker]
