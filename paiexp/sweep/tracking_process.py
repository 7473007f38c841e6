"""The sweep's tracking process and its two queues, which a command that runs a sweep starts
as it begins: the process imports MLflow (most of two CPU-seconds) while the launcher composes
the config and opens the study, then takes the sweep's :class:`TrackingSetup` as its first
message.  Light to import: the command imports it before anything else."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.connection import Connection
from typing import Any


class TrackingProcess:
    """A started tracking process (:func:`paiexp.sweep.tracking_worker.serve`): the launcher
    puts calls in its queue and reads its replies from a pipe whose only writing end is the
    process's, so the pipe's end is the process's end (every whole reply read first)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.calls: Any = context.Queue()
        self.replies, writing_end = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_serve,
            args=(self.calls, writing_end, os.getpid()),
            name="paiexp-tracking",
            daemon=True,  # one the command never used ends with it
        )
        self.process.start()
        writing_end.close()


_ahead: TrackingProcess | None = None


def start_ahead() -> None:
    """Start the tracking process of the sweep this command is about to run."""
    global _ahead
    if _ahead is None:
        _ahead = TrackingProcess()


def take() -> TrackingProcess:
    """The process started ahead, if it is still there, else a new one."""
    global _ahead
    started, _ahead = _ahead, None
    if started is not None and started.process.is_alive():
        return started
    return TrackingProcess()


def _serve(calls: Any, replies: Connection, launcher_pid: int) -> None:
    from paiexp.sweep.tracking_worker import serve

    serve(calls, replies, launcher_pid)
