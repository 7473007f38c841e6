"""The study's journal file, appended whole or not at all.

Optuna's journal is a file of JSON records, one a line, that every launcher appends to.  An
append cut short (a full disk, a quota) would leave a torn record that the next append
glues onto, and Optuna refuses the whole file from that line on.  Here an append that fails
is cut off again before the error goes on, and a torn last record (a launcher killed
mid-append) is cut off before the next append: readers skip a last line without its newline,
so the journal always reads as its last whole record left it.

An append that creates a study or a trial, or changes a trial's state, is synced to the disk
(Optuna's own backend syncs every append); one that only adds to a trial (its parameters,
attributes and intermediate values: ~15 records a trial, each a sync of a few milliseconds in
the launcher's loop) is synced with the next that is, at the latest as its trial ends.  What
such a record says is needed back only after a crash of the whole machine, and then the trial
either ends as its launcher left it (a job is found again by its deterministic name) or is
failed and its point asked for again (some of its parameters lost); a crash of a launcher
loses nothing written.  The steps a launcher reads from a job's log at once are appended
together (:func:`one_append`): one lock and one write, not one per step.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import get_lock_file
from optuna.storages.journal._storage import JournalOperation

if TYPE_CHECKING:
    from optuna import Study

INTERMEDIATE = JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE
# Records that only add to a trial: synced with the next record of another kind.
SYNCED_LATER = {
    INTERMEDIATE,
    JournalOperation.SET_TRIAL_PARAM,
    JournalOperation.SET_TRIAL_USER_ATTR,
    JournalOperation.SET_TRIAL_SYSTEM_ATTR,
}
TAIL_CHUNK = 1 << 16  # bytes read at a time, backwards, looking for the last whole record


class WholeRecordJournal(JournalFileBackend):
    """A journal file whose records are appended whole or not at all."""

    def __init__(self, file_path: str) -> None:
        super().__init__(file_path)
        self._held: list[dict[str, Any]] = []  # intermediate values to append with the next
        self._holding = 0
        self._hold_lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Intermediate values appended in this block are written as it ends, in one
        append (with any other record appended meanwhile, in their order)."""
        with self._hold_lock:
            self._holding += 1
        try:
            yield
        finally:
            with self._hold_lock:
                self._holding -= 1
                logs, self._held = (self._held, []) if not self._holding else ([], self._held)
            if logs:
                self._append(logs)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with self._hold_lock:
            if self._holding and all(log["op_code"] == INTERMEDIATE for log in logs):
                self._held.extend(logs)
                return
            logs, self._held = self._held + logs, []
        self._append(logs)

    def _append(self, logs: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        with get_lock_file(self._lock):
            descriptor = os.open(self._file_path, os.O_RDWR | os.O_APPEND)
            try:
                end = whole_records_end(descriptor)
                if end != os.fstat(descriptor).st_size:
                    os.ftruncate(descriptor, end)  # a torn record a killed launcher left
                try:
                    write_all(descriptor, data)
                    if not all(log["op_code"] in SYNCED_LATER for log in logs):
                        os.fsync(descriptor)
                except OSError as exc:
                    os.ftruncate(descriptor, end)
                    exc.filename = exc.filename or self._file_path
                    raise
            finally:
                os.close(descriptor)


@contextmanager
def one_append(study: Study) -> Iterator[None]:
    """The intermediate values reported to ``study`` in this block go to its journal file in
    one append as the block ends (a trial's own reports, and its pruning, read them from the
    trial); a study in a database writes each as it comes."""
    backend = getattr(getattr(study, "_storage", None), "_backend", None)  # Optuna's storage
    if not isinstance(backend, WholeRecordJournal):
        yield
        return
    with backend.held():
        yield


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
