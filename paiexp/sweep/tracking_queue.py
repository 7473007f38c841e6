"""The tracking process's view of its queue: the launcher's calls in order, a trial's start
joined with its finish when both wait (the process lagged behind the trial's job)."""

from __future__ import annotations

import queue
from collections import deque
from typing import Any

from paiexp.sweep.tracking_messages import (
    Call,
    Close,
    FinishChild,
    StartAndFinishChild,
    StartChild,
)


class CallQueue:
    """The calls of a ``multiprocessing`` queue, taken one at a time.

    A trial's :class:`StartChild` and its :class:`FinishChild`, both waiting, come as one
    :class:`StartAndFinishChild` where the start's place was: every call between them is of
    other trials, and none that concerns this one can come before its finish.  Only a start
    whose run is surely new (not adopted, no other launcher in the study) is joined."""

    def __init__(self, calls: Any) -> None:
        self._calls = calls
        self._waiting: deque[Call | Close] = deque()

    def take(self) -> Call | Close:
        """The next call, waiting for one if none is queued."""
        if not self._waiting:
            self._waiting.append(self._calls.get())
        self._take_queued()
        call = self._waiting.popleft()
        if isinstance(call, StartChild) and not (call.adopted or call.shared):
            finish = self._finish_of(call.job_name)
            if finish is not None:
                self._waiting.remove(finish)
                return StartAndFinishChild(call, finish)
        return call

    def _take_queued(self) -> None:
        while True:
            try:
                self._waiting.append(self._calls.get_nowait())
            except queue.Empty:
                return

    def _finish_of(self, job_name: str) -> FinishChild | None:
        for call in self._waiting:
            if isinstance(call, FinishChild) and call.job_name == job_name:
                return call
        return None
