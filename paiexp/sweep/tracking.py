"""MLflow for a sweep: one parent run per study, one child run per trial.

All of it runs in a child process (:mod:`paiexp.sweep.tracking_worker`), fed typed calls
(:mod:`paiexp.sweep.tracking_messages`) through a queue, in order.  The launcher never
imports MLflow, never waits for it and never shares an interpreter lock with it: MLflow's
seconds of start-up overlap the first trials without delaying them.  Child runs are found
again by their job name (a tag), which a trial records before its job exists.
"""

from __future__ import annotations

import queue
from typing import Any

from paiexp.sweep import tracking_process
from paiexp.sweep.tracker_protocol import Tracker
from paiexp.sweep.tracking_messages import (
    Call,
    CallFailed,
    Close,
    Closed,
    Notice,
    Reply,
    RunCreated,
    TrackingSetup,
)


class SweepTracker(Tracker):
    """The launcher's handle on the tracking process: each call goes into its queue."""

    def __init__(self, setup: TrackingSetup) -> None:
        super().__init__()
        started = tracking_process.take()  # the one the command started ahead, if any
        self._calls: Any = started.calls
        self._replies: Any = started.replies
        self._process = started.process
        self._calls.put(setup)
        self.uri: str | None = None

    def send(self, call: Call | Close) -> None:
        self._calls.put(call)

    def take_replies(self, *, block: bool = False) -> None:
        """Take the replies so far; with ``block``, up to :class:`Closed`."""
        while True:
            try:
                reply: Reply = self._replies.get(block=block, timeout=None)
            except queue.Empty:
                return
            match reply:
                case RunCreated(job_name=job_name, run_id=run_id):
                    self._run_ids[job_name] = run_id
                case CallFailed(text=text, fatal=fatal, disk_full=disk_full):
                    self.errors.append(text)
                    if fatal:
                        self._fatal = text
                    self._disk_full = self._disk_full or disk_full
                case Notice(text=text):
                    self.notify(text)
                case Closed(uri=uri, experiment_id=experiment_id, registered=registered):
                    self.uri = uri
                    self.experiment_id = experiment_id
                    self.registered = registered
                    self.best = reply.best
                    return

    def close(self) -> str | None:
        """Wait until every queued call is done; returns the tracking URI, if it opened."""
        self.send(Close())
        self.take_replies(block=True)
        self._process.join()
        return self.uri
