"""A full disk (or a spent quota) under what paiexp writes: recognised wherever a write fails,
and told in one line that names the file and says what to do.

Loads the standard library only: the local job runner imports it without ``site``.
"""

from __future__ import annotations

import contextlib
import errno
import os

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
SQLITE_FULL = 13  # SQLite's "database or disk is full"
SQLITE_IOERR = 10  # SQLite's "disk I/O error" (its extended codes share the low byte)
# How a job's log or a database says it: strerror(ENOSPC), strerror(EDQUOT), SQLite's.
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


class DiskFull(Exception):
    """A write failed because its file system is full: ``path`` is the file (or directory)
    written, None when the error did not name it; ``what`` says what filled ("no space left
    on device", "disk quota exceeded"); ``details`` is for the log file, not the terminal."""

    def __init__(self, path: str | None, what: str, details: str = "") -> None:
        super().__init__(path, what, details)
        self.path = path
        self.what = what
        self.details = details

    def __str__(self) -> str:
        where = f" writing {shown_path(self.path)}" if self.path else ""
        return f"{self.what}{where}: free space, then run the same command again"


def disk_full(exc: BaseException, path: str | None = None, details: str = "") -> DiskFull | None:
    """The :class:`DiskFull` an error is (or was raised from, or while handling), None when
    none of them is a full disk; ``path``: the file written, when the error does not name it."""
    from paiexp.util.outage import chain

    for error in chain(exc):
        if isinstance(error, DiskFull):
            return error
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            named = error.filename if isinstance(error.filename, str) else path
            return DiskFull(named, _what(error.errno), details)
        code = getattr(error, "sqlite_errorcode", None)
        if code == SQLITE_FULL or (code is not None and _io_error_of_full(code, path)):
            return DiskFull(path, "no space left on device", details)
    return None


def _io_error_of_full(code: int, path: str | None) -> bool:
    """Whether an SQLite I/O error was the database's file system filling: a write-ahead
    log's shared-memory file that cannot be made says "disk I/O error", not "disk is full"."""
    return code & 0xFF == SQLITE_IOERR and path is not None and nearly_full(os.path.dirname(path))


def says_disk_full(lines: list[str]) -> bool:
    """Whether a job's log says that a write of its failed on a full disk."""
    return any(text in line for line in lines for text in DISK_FULL_TEXTS)


def nearly_full(path: str, margin: int = 1 << 20) -> bool:
    """Whether the file system holding ``path`` has less than ``margin`` bytes left for it."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < margin


def shown_path(path: str) -> str:
    """A path as the user knows it: relative to the current directory when under it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _what(code: int | None) -> str:
    return "disk quota exceeded" if code == errno.EDQUOT else "no space left on device"


def record_details(full: DiskFull, exc: BaseException) -> str | None:
    """Write what went wrong (the traceback, and ``full.details``) where it fits: the project's
    ``.paiexp/logs`` (its disk may be the full one), else the temporary directory; the file
    written, None when neither had room.  URLs' passwords are left out."""
    import tempfile
    import time
    import traceback

    from paiexp.util.redact import redact_urls

    text = "".join(traceback.format_exception(exc))
    if full.details:
        text += f"\n{full.details}\n"
    name = f"disk-full-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for directory in (os.path.join(".paiexp", "logs"), tempfile.gettempdir()):
        path = os.path.join(directory, name)
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "w") as stream:
                stream.write(redact_urls(text))
            return shown_path(os.path.abspath(path))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return None
