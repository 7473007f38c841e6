"""Atomic steps that launchers sharing a study take one at a time: claims and budget checks.

A claim sets a RUNNING trial's owner (``paiexp:owner``) only if it is the one expected: of
two launchers adopting one trial, exactly one wins.  :meth:`Claims.exclusive` lets one
launcher at a time check the study's budget and ask for a trial, so that launchers asking
together never make more than ``n_trials``; a launcher that waits for it over
:data:`LOCK_WAIT` seconds (another launcher holding it was stopped mid-step) goes on
without it, to follow its jobs, and tries again later.

In a journal file both go through a lock file beside it that only paiexp's launchers take
(Optuna's own lock guards each append, not a read and a write); so do a SQLite database's.
In a database server a claim is one transaction on Optuna's attribute table, and the
exclusive step holds a row lock on an attribute of the study (``paiexp:lock``) that Optuna
itself never locks.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from paiexp.sweep.records import LOCK, OWNER
from paiexp.util.outage import transient_database_error

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

    from paiexp.util.outage import Outage

T = TypeVar("T")


LOCK_WAIT = 2  # seconds a launcher waits for a database's lock row


class Claims(Protocol):
    def claim(self, trial_id: int, expected: str | None, new: str) -> bool:
        """Set a RUNNING trial's owner to ``new`` if it is ``expected`` (None: unset)."""

    def exclusive(self) -> contextlib.AbstractContextManager[bool]:
        """Hold off every other launcher's exclusive step (and, in a file, its claims);
        yields whether it got to (False: it waited too long)."""


class FileClaims:
    """Claims and the exclusive step under a lock file beside ``path`` (a journal file or a
    SQLite database).  A lock left by a launcher that died is broken after 30 s."""

    def __init__(self, storage: BaseStorage, path: str) -> None:
        from optuna.storages.journal import JournalFileSymlinkLock

        self.storage = storage
        target = f"{path}.paiexp-owner"
        # The lock is a link to this file: Optuna breaks a lock it can read no time of never
        # (it retries at once, for ever), so the file must exist.  Never written, its time is
        # left alone.
        with open(target, "a"):
            pass
        self.lock = JournalFileSymlinkLock(target)
        self.held = False

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[bool]:
        self.lock.acquire()
        self.held = True
        try:
            yield True
        finally:
            self.held = False
            with contextlib.suppress(RuntimeError):  # broken meanwhile (held over 30 s)
                self.lock.release()

    def claim(self, trial_id: int, expected: str | None, new: str) -> bool:
        if not self.held:
            with self.exclusive():
                return self.claim(trial_id, expected, new)
        trial = self.storage.get_trial(trial_id)  # reads every write made so far
        if trial.state.is_finished() or trial.user_attrs.get(OWNER) != expected:
            return False
        self.storage.set_trial_user_attr(trial_id, OWNER, new)
        return True


class RdbClaims:
    """Claims in a database server: in one transaction that locks the trial's row (as
    Optuna's own state changes do), the owner inserted where there is none (the attribute's
    unique key refuses a second) or updated where it is the one expected.  With ``outage``,
    a claim or the exclusive step that finds the server gone is tried again until it is back
    (a lock waited for too long is no outage)."""

    def __init__(
        self, storage: BaseStorage, study_id: int, url: str, outage: Outage | None = None
    ) -> None:
        import sqlalchemy as sa

        self.study_id = study_id
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        self.outage = outage
        columns = ("trial_id", "key", "value_json")
        self.attrs = sa.table("trial_user_attributes", *(sa.column(c) for c in columns))
        self.trials = sa.table("trials", sa.column("trial_id"), sa.column("state"))
        self.study_attrs = sa.table("study_system_attributes", *map(sa.column, ("study_id", "key")))
        storage.set_study_system_attr(study_id, LOCK, True)  # the row exclusive() locks

    def _patiently(self, attempt: Callable[[], T]) -> T:
        return attempt() if self.outage is None else self.outage.call(attempt)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[bool]:
        import sqlalchemy as sa

        connection, acquired = self._patiently(self._lock)
        try:
            yield acquired
        finally:
            with contextlib.suppress(sa.exc.DBAPIError):  # gone meanwhile: so is the lock
                connection.commit()
            connection.close()

    def _lock(self) -> tuple[Any, bool]:
        """A connection in a transaction, and whether it holds the lock row."""
        import sqlalchemy as sa

        attrs = self.study_attrs
        lock = (
            sa.select(attrs.c.key)
            .where(attrs.c.study_id == self.study_id)
            .where(attrs.c.key == LOCK)
            .with_for_update()
        )
        connection = self.engine.connect()
        try:
            self._wait_briefly(connection)
            try:
                connection.execute(lock)
            except sa.exc.OperationalError as exc:  # waited too long: it rolls back
                if transient_database_error(exc):
                    raise
                connection.rollback()
                return connection, False
            return connection, True
        except BaseException:
            connection.close()
            raise

    def _wait_briefly(self, connection: Any) -> None:
        """Row locks in this transaction are waited for at most LOCK_WAIT seconds."""
        import sqlalchemy as sa

        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            connection.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_WAIT}s'"))
        elif dialect in ("mysql", "mariadb"):
            connection.execute(sa.text(f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT}"))

    def claim(self, trial_id: int, expected: str | None, new: str) -> bool:
        return self._patiently(lambda: self._claim(trial_id, expected, new))

    def _claim(self, trial_id: int, expected: str | None, new: str) -> bool:
        import sqlalchemy as sa

        attrs, trials = self.attrs, self.trials
        value = json.dumps(new)  # as Optuna stores a value
        try:
            with self.engine.begin() as connection:
                self._wait_briefly(connection)
                state = connection.execute(
                    sa.select(trials.c.state).where(trials.c.trial_id == trial_id).with_for_update()
                ).scalar()
                if str(state).rpartition(".")[2] != "RUNNING":
                    return False
                current = connection.execute(
                    sa.select(attrs.c.value_json)
                    .where(attrs.c.trial_id == trial_id)
                    .where(attrs.c.key == OWNER)
                ).scalar()
                if current == value:  # a try the outage cut short had claimed it
                    return True
                if expected is None:
                    connection.execute(
                        attrs.insert().values(trial_id=trial_id, key=OWNER, value_json=value)
                    )
                    return True
                updated = connection.execute(
                    attrs.update()
                    .where(attrs.c.trial_id == trial_id)
                    .where(attrs.c.key == OWNER)
                    .where(attrs.c.value_json == json.dumps(expected))
                    .values(value_json=value)
                )
                return bool(updated.rowcount == 1)
        except sa.exc.IntegrityError:  # another launcher inserted an owner first
            return False
        except sa.exc.OperationalError as exc:  # its row stayed locked: another check tries again
            if transient_database_error(exc):
                raise
            return False


def create_claims(storage: BaseStorage, study_id: int, location: str) -> Claims:
    """The claims of the study storage at ``location``: an RDB URL or a journal file."""
    if "://" not in location:
        return FileClaims(storage, location)
    import sqlalchemy as sa

    url = sa.engine.make_url(location)
    if url.get_backend_name() == "sqlite":  # no row locks: a lock file beside the database
        return FileClaims(storage, str(url.database))
    from paiexp.sweep.patient_storage import outage_of

    return RdbClaims(storage, study_id, location, outage_of(storage))
