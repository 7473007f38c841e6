"""The study's journal file, appended whole or not at all.

Optuna's journal is a file of JSON records, one a line, that every launcher appends to.  An
append cut short (a full disk, a quota) would leave a torn record that the next append
glues onto, and Optuna refuses the whole file from that line on.  Here an append that fails
is cut off again before the error goes on, and a torn last record (a launcher killed
mid-append) is cut off before the next append: readers skip a last line without its newline,
so the journal always reads as its last whole record left it.

Each append is synced to the disk, as Optuna's own backend does, except one of intermediate
values only (a pruned metric's steps: most of a sweep's records, reported as its jobs log
them): the next record of another kind, at the latest its trial's end, syncs them with it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import get_lock_file
from optuna.storages.journal._storage import JournalOperation

INTERMEDIATE = JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE
TAIL_CHUNK = 1 << 16  # bytes read at a time, backwards, looking for the last whole record


class WholeRecordJournal(JournalFileBackend):
    """A journal file whose records are appended whole or not at all."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        with get_lock_file(self._lock):
            descriptor = os.open(self._file_path, os.O_RDWR | os.O_APPEND)
            try:
                end = whole_records_end(descriptor)
                if end != os.fstat(descriptor).st_size:
                    os.ftruncate(descriptor, end)  # a torn record a killed launcher left
                try:
                    write_all(descriptor, data)
                    if not all(log["op_code"] == INTERMEDIATE for log in logs):
                        os.fsync(descriptor)
                except OSError as exc:
                    os.ftruncate(descriptor, end)
                    exc.filename = exc.filename or self._file_path
                    raise
            finally:
                os.close(descriptor)


def whole_records_end(descriptor: int) -> int:
    """The offset just after the file's last newline (0 when it has none)."""
    end = os.fstat(descriptor).st_size
    position = end
    while position > 0:
        start = max(0, position - TAIL_CHUNK)
        chunk = os.pread(descriptor, position - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


def write_all(descriptor: int, data: bytes) -> None:
    """Write all of ``data`` (a write to a nearly full disk may write part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]
