"""What the kernel says of its out-of-memory killer: the processes it killed, as its log
(``/dev/kmsg``) records them ("Killed process PID (NAME)").  Never a guess: where the log
cannot be read, nothing is said.

Standard library only: the local job runner imports it without ``site``.
"""

from __future__ import annotations

import errno
import os
import re

KERNEL_LOG = "/dev/kmsg"
KILLED = re.compile(rb"Killed process (\d+) \(([^)]*)\)")
RECORD_BYTES = 8192  # one record of the kernel log is at most this long
CLOCK_SLACK = 1.0  # seconds: the log's clock and time.monotonic() differ by a little


def oom_killed(since: float, log: str = KERNEL_LOG) -> dict[int, str]:
    """The processes (pid -> command name) the kernel's out-of-memory killer killed since
    ``since`` (a ``time.monotonic()`` reading: the log's clock, seconds since boot); empty
    where the log cannot be read."""
    try:
        descriptor = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    killed: dict[int, str] = {}
    try:
        while True:
            try:
                record = os.read(descriptor, RECORD_BYTES)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten as it was read: read on
                    continue
                break  # EAGAIN: the end of the log
            if not record:
                break
            header, _, message = record.partition(b";")
            fields = header.split(b",")
            if len(fields) < 3 or int(fields[2]) / 1e6 < since - CLOCK_SLACK:
                continue
            found = KILLED.search(message)
            if found:
                killed[int(found.group(1))] = found.group(2).decode(errors="replace")
    finally:
        os.close(descriptor)
    return killed


def sigkill_reason(pid: int, since: float) -> str:
    """What follows ``command killed by SIGKILL`` for the command ``pid`` that started at
    ``since``: out of memory only when the kernel's log says its killer killed it; the
    killer's other kills meanwhile, said as facts; else nothing."""
    killed = oom_killed(since)
    if pid in killed:
        return ": out of memory (the kernel's out-of-memory killer killed it)"
    if killed:
        named = ", ".join(f"{name} (pid {number})" for number, name in sorted(killed.items()))
        return f"; the kernel's out-of-memory killer killed {named} as it ran"
    return ""
