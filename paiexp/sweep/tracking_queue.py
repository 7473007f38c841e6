"""The tracking process's view of its queue: the launcher's calls in order, a trial's start
joined with its finish when both wait (the process lagged behind the trial's job)."""

from __future__ import annotations

import queue
from collections import deque
from dataclasses import replace
from typing import Any

from paiexp.sweep.tracking_messages import (
    Close,
    FinishChild,
    LogPoints,
    Sent,
    StartAndFinishChild,
    StartChild,
)


class CallQueue:
    """The calls of a ``multiprocessing`` queue, taken one at a time.

    A trial's :class:`StartChild` and its :class:`FinishChild`, both waiting, come as one
    :class:`StartAndFinishChild` where the start's place was: every call between them is of
    other trials, and none that concerns this one can come before its finish.  Only a start
    whose run is surely new (not adopted, no other launcher in the study) and whose points
    wait in no :class:`LogPoints` between the two (sent again to a new tracking process) is
    joined."""

    def __init__(self, calls: Any) -> None:
        self._calls = calls
        self._waiting: deque[Sent | Close] = deque()

    def take(self) -> Sent | Close:
        """The next call, waiting for one if none is queued."""
        if not self._waiting:
            self._waiting.append(self._calls.get())
        self._take_queued()
        sent = self._waiting.popleft()
        if isinstance(sent, Close):
            return sent
        start = sent.call
        if isinstance(start, StartChild) and not (start.adopted or start.shared):
            finish = self._finish_of(start.job_name)
            if finish is not None:
                self._waiting.remove(finish)
                assert isinstance(finish.call, FinishChild)
                return replace(
                    sent,
                    at=finish.at,
                    call=StartAndFinishChild(start, finish.call),
                    again=sent.again or finish.again,
                    joined=finish.number,
                )
        return sent

    def _take_queued(self) -> None:
        while True:
            try:
                self._waiting.append(self._calls.get_nowait())
            except queue.Empty:
                return

    def _finish_of(self, job_name: str) -> Sent | None:
        """The trial's finish, waiting, unless points of its own come first."""
        for sent in self._waiting:
            if not isinstance(sent, Sent):
                continue
            call = sent.call
            if isinstance(call, LogPoints) and job_name in call.points:
                return None
            if isinstance(call, FinishChild) and call.job_name == job_name:
                return sent
        return None
