"""MLflow for a sweep: one parent run per study, one child run per trial.

All of it runs in a child process (:mod:`paiexp.sweep.tracking_worker`), fed typed calls
(:mod:`paiexp.sweep.tracking_messages`) through a queue, in order.  The launcher never
imports MLflow, never waits for it and never shares an interpreter lock with it: MLflow's
seconds of start-up overlap the first trials without delaying them.  Child runs are found
again by their job name (a tag), which a trial records before its job exists.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections.abc import Iterable, Mapping
from typing import Any

from paiexp.metrics import MetricPoint
from paiexp.monitor import JobResult
from paiexp.sweep.tracking_messages import (
    Call,
    CallFailed,
    Close,
    Closed,
    FailChild,
    FinishChild,
    FinishedTrial,
    FinishParent,
    NewParentRun,
    OpenParent,
    Reconcile,
    Reply,
    RunCreated,
    StartChild,
    TrackingSetup,
    TrialRecord,
    UpdateBest,
)
from paiexp.sweep.tracking_worker import PARENT_RUN_ATTR, serve
from paiexp.tracking import TRIAL_STATE_TO_RUN_STATUS

__all__ = [
    "PARENT_RUN_ATTR",
    "TRIAL_STATE_TO_RUN_STATUS",
    "FinishedTrial",
    "SweepTracker",
    "TrackingSetup",
    "TrialRecord",
]


class SweepTracker:
    """The launcher's handle on the tracking process. ``fatal`` says when tracking cannot
    work (the launcher then stops submitting)."""

    def __init__(self, setup: TrackingSetup) -> None:
        context = multiprocessing.get_context("spawn")
        self._calls: Any = context.Queue()
        self._replies: Any = context.Queue()
        self._process = context.Process(
            target=serve,
            args=(setup, self._calls, self._replies, os.getpid()),
            name="paiexp-tracking",
            daemon=True,
        )
        self._process.start()
        self._fatal: str | None = None
        self._run_ids: dict[str, str] = {}
        self.errors: list[str] = []
        self.uri: str | None = None

    def _send(self, message: Call | Close) -> None:
        self._calls.put(message)

    @property
    def fatal(self) -> str | None:
        self._read_replies()
        return self._fatal

    @property
    def run_ids(self) -> dict[str, str]:
        """Job name -> the id of its trial's run, for the runs created so far."""
        self._read_replies()
        return self._run_ids

    def _read_replies(self, *, block: bool = False) -> None:
        """Take the replies so far; with ``block``, up to :class:`Closed`."""
        while True:
            try:
                reply: Reply = self._replies.get(block=block, timeout=None)
            except queue.Empty:
                return
            match reply:
                case RunCreated(job_name=job_name, run_id=run_id):
                    self._run_ids[job_name] = run_id
                case CallFailed(text=text, fatal=fatal):
                    self.errors.append(text)
                    if fatal:
                        self._fatal = text
                case Closed(uri=uri):
                    self.uri = uri
                    return

    def open_parent(
        self,
        sweep_id: str,
        known_run_id: str | None,
        create: Mapping[str, Any],
        invocation: Mapping[str, str],
    ) -> None:
        """``create``: the new parent run's ``study_name`` (its name), ``tags`` and ``params``."""
        new = NewParentRun(
            run_name=str(create["study_name"]),
            tags=dict(create["tags"]),
            params={key: str(value) for key, value in create["params"].items()},
        )
        self._send(OpenParent(sweep_id, known_run_id, new, dict(invocation)))

    def reconcile(self, trials: Iterable[FinishedTrial]) -> None:
        """Trials that finished before this launch: each gets a closed run."""
        self._send(Reconcile(tuple(trials)))

    def start_child(
        self, job_name: str, record: TrialRecord, tags: Mapping[str, str], *, adopted: bool = False
    ) -> None:
        self._send(StartChild(job_name, record, dict(tags), adopted))

    def finish_child(
        self,
        job_name: str,
        result: JobResult,
        unlogged: list[MetricPoint],
        status: str,
        reason: str | None,
        tags: Mapping[str, str],
    ) -> None:
        self._send(FinishChild(job_name, result, tuple(unlogged), status, reason, dict(tags)))

    def fail_child(self, job_name: str, reason: str) -> None:
        self._send(FailChild(job_name, reason))

    def update_best(
        self, metrics: Mapping[str, float], step: int, tags: Mapping[str, str], best_job: str | None
    ) -> None:
        self._send(UpdateBest(dict(metrics), step, dict(tags), best_job))

    def finish_parent(self, *, interrupted: bool) -> None:
        self._send(FinishParent(interrupted))

    def close(self) -> str | None:
        """Wait until every queued call is done; returns the tracking URI, if it opened."""
        self._send(Close())
        self._read_replies(block=True)
        self._process.join()
        return self.uri
