"""Process helpers over ``/proc`` and ``flock``: is a process (still) the one we started, does
a job's runner hold its lock, stop a whole process group.

Standard library only: the local job runner imports it without ``site``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal


def process_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live process from a reused pid)."""
    fields = process_stat(pid)
    return fields[19] if fields else None


def process_alive(pid: int, start_time: str | None) -> bool:
    """Whether ``pid`` runs and is the process that started at ``start_time`` (if given)."""
    fields = process_stat(pid)
    if fields is None or (start_time is not None and fields[19] != start_time):
        return False
    return fields[0] != "Z"  # a zombie has exited


def lock_held(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds an exclusive ``flock`` on ``path``."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group; one that is gone (or not ours) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
