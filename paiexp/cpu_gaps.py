"""A gap in the machine's CPU use: a CPU with nothing to run now (Linux's count of runnable
threads, ``/proc/loadavg``).  A sweep's tracking process applies its calls in such gaps while
trials train on every core, rather than taking CPU-seconds from them, and at once when the
sweep ends: unlike a low scheduling priority, which an unprivileged process cannot drop
again, waiting for a gap cannot starve the end of a sweep behind other programs' work.
"""

from __future__ import annotations

import os
from typing import Protocol

LOADAVG = "/proc/loadavg"
POLL_SECONDS = 0.01


class Flag(Protocol):
    """What ends the waiting: a ``threading`` or ``multiprocessing`` event."""

    def wait(self, timeout: float | None = None) -> bool: ...


def runnable_threads() -> int | None:
    """Threads running or ready to run on the machine now, the caller's among them (None
    off Linux)."""
    try:
        with open(LOADAVG, "rb") as loadavg:
            running = loadavg.read().split()[3]  # "0.52 0.58 0.59 3/1024 4242"
    except (OSError, IndexError):
        return None
    return int(running.split(b"/")[0])


def has_gap(cpus: int) -> bool:
    """Whether a CPU has nothing else to run now (or that cannot be told)."""
    runnable = runnable_threads()
    return runnable is None or runnable <= cpus


def wait_for_gap(until: Flag, poll: float = POLL_SECONDS) -> None:
    """Return once a CPU has nothing else to run, or once ``until`` is set."""
    cpus = len(os.sched_getaffinity(0))
    while not has_gap(cpus) and not until.wait(poll):
        pass
