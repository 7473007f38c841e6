"""MLflow for a sweep: one parent run per study, one child run per trial.

All of it runs in a child process (:mod:`paiexp.sweep.tracking_worker`), fed typed calls
(:mod:`paiexp.sweep.tracking_messages`) through a queue, in order.  The launcher never
imports MLflow, never waits for it and never shares an interpreter lock with it: MLflow's
seconds of start-up overlap the first trials without delaying them.  Child runs are found
again by their job name (a tag), which a trial records before its job exists.
"""

from __future__ import annotations

import itertools
import signal
import time
from dataclasses import replace

from paiexp.sweep import tracking_process
from paiexp.sweep.tracker_protocol import Tracker
from paiexp.sweep.tracking_messages import (
    Call,
    CallFailed,
    Close,
    Closed,
    Done,
    Notice,
    ParentOpened,
    Reply,
    Resumed,
    RunCreated,
    Sent,
    TrackingSetup,
)

# A tracking process that dies this many times in a row, no call done in between, is not
# started again: the sweep's tracking has failed.
MAX_RESTARTS = 3


class SweepTracker(Tracker):
    """The launcher's handle on the tracking process: each call goes into its queue,
    numbered, and is kept until the process says it is done.  A tracking process that dies
    (killed, out of memory) is replaced at once by one that is told the runs the dead one
    opened (the parent's, the trials') and sent every call not done, again: applied as
    retries, stamped as first sent, they make each run whole once, as after a tracking
    outage."""

    def __init__(self, setup: TrackingSetup) -> None:
        super().__init__()
        self._setup = setup
        self._pending: dict[int, Sent] = {}  # sent, not done yet, in the order sent
        self._parent_run_id: str | None = None
        self._numbers = itertools.count()
        self._closing = False
        self._closed = False
        self._restarts = 0  # in a row, no call done since
        self._attach(tracking_process.take(), setup)  # the one started ahead, if any
        self.uri: str | None = None

    def _attach(self, started: tracking_process.TrackingProcess, setup: TrackingSetup) -> None:
        self._started = started
        started.calls.put(setup)

    def send(self, call: Call | Close) -> None:
        if isinstance(call, Close):
            self._closing = True
            self._started.calls.put(call)
            return
        sent = Sent(next(self._numbers), time.time(), call)
        self._pending[sent.number] = sent
        self._started.calls.put(sent)

    def take_replies(self, *, block: bool = False) -> None:
        """Take the replies so far; with ``block``, up to :class:`Closed` (or until the
        tracking process has died for good).  A tracking process found dead (its pipe ended:
        every whole reply it wrote read first) is replaced."""
        while not self._closed:
            replies = self._started.replies
            try:
                if not replies.poll(None if block else 0):
                    return
                reply: Reply = replies.recv()
            except (EOFError, OSError):  # it died (a reply it was cut off in is dropped)
                if not self._restart():
                    return
                continue
            match reply:
                case Done(numbers=numbers):
                    for number in numbers:
                        self._pending.pop(number, None)
                    self._restarts = 0
                case RunCreated(job_name=job_name, run_id=run_id):
                    self._run_ids[job_name] = run_id
                case ParentOpened(run_id=run_id):
                    self._parent_run_id = run_id
                case CallFailed(text=text, fatal=fatal, disk_full=disk_full):
                    self.errors.append(text)
                    if fatal:
                        self._fatal = text
                    self._disk_full = self._disk_full or disk_full
                case Notice(text=text):
                    self.notify(text)
                case Closed(uri=uri, experiment_id=experiment_id, registered=registered):
                    self._closed = True  # the pipe's end is the process's own, now
                    self.uri = uri
                    self.experiment_id = experiment_id
                    self.registered = registered
                    self.best = reply.best
                    return

    def _restart(self) -> bool:
        """Replace the dead tracking process with a new one sent every call not done (and the
        close, if sent); False, tracking failed, when it died too often or had failed."""
        dead = self._started
        dead.calls.cancel_join_thread()  # nobody reads what is left in its queue
        dead.replies.close()
        dead.process.join()
        how = exit_description(dead.process.exitcode)
        if self._fatal is not None:  # nothing was being tracked any more
            return False
        self._restarts += 1
        if self._restarts > MAX_RESTARTS:
            self._fatal = (
                f"the tracking process died {MAX_RESTARTS + 1} times in a row ({how}), "
                "no call done in between"
            )
            return False
        waiting = len(self._pending)
        self.notify(
            f"the tracking process died ({how}); a new one applies the {waiting} "
            f"MLflow call{'s' if waiting != 1 else ''} it had not done"
        )
        made = Resumed(self._parent_run_id, dict(self._run_ids))
        self._attach(tracking_process.TrackingProcess(), replace(self._setup, resumed=made))
        for sent in self._pending.values():
            self._started.calls.put(replace(sent, again=True))
        if self._closing:
            self._started.calls.put(Close())
        return True

    def close(self) -> str | None:
        """Wait until every queued call is done; returns the tracking URI, if it opened."""
        self.send(Close())
        self.take_replies(block=True)
        self._started.process.join()
        return self.uri


def exit_description(code: int | None) -> str:
    """How a process ended, from ``multiprocessing``'s exit code (-N: signal N)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
