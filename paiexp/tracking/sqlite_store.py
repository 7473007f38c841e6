"""A new SQLite tracking store, made fast and whole: MLflow's schema is built once per machine
and MLflow version as a cached empty database (seconds of migrations), and each new
``mlflow.db`` is an atomic copy of it; a launcher killed meanwhile leaves no half-built file.
A sweep's tracking process writes its store through a write-ahead log (:func:`write_ahead`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from paiexp.util.cache import cache_root


def sqlite_file(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI (None for another store)."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    return Path(uri.removeprefix("sqlite:///")).resolve()


def new_sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI that does not exist yet (None otherwise)."""
    path = sqlite_file(uri)
    return None if path is None or path.exists() else path


def template_path() -> Path:
    """An empty tracking database of the installed MLflow version, built once per machine."""
    from importlib.metadata import version

    return cache_root() / f"mlflow-{version('mlflow')}-empty.db"


def _temporary(path: Path) -> Path:
    """A name beside ``path`` no other process or thread writes: threads of one process (two
    trackers, say) may make the same file at once."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.creating")


def create_sqlite_database(uri: str) -> None:
    """Create a new SQLite tracking database atomically, building the cached template first
    (seconds, once per machine and MLflow version; later databases are copies of it).

    MLflow builds its schema with seconds of migrations; a launcher killed in the middle would
    leave a half-migrated file that every later launch refuses.  So a schema is only ever
    built under a temporary name and linked into place when complete.
    """
    path = new_sqlite_path(uri)
    if path is None:
        return
    template = template_path()
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        _build_schema(template)
    except OSError:  # no writable cache: build this database itself
        _build_schema(path)
        return
    copy_template(path)


def _build_schema(path: Path) -> None:
    """MLflow's own schema build (its store runs every migration on an empty file), under a
    temporary name linked into place when complete.

    Nobody can see that file until it is linked, so its connections skip the per-commit fsync
    of the dozens of migration transactions (``synchronous=OFF``, rollback journal in memory;
    neither is stored in the file); the finished file is synced once before it is linked.
    """
    from mlflow.tracking._tracking_service.utils import _get_store
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    temporary = _temporary(path)

    def unsynced(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        try:
            files = [row[2] for row in cursor.execute("PRAGMA database_list") if row[1] == "main"]
            if files and os.path.basename(files[0]) == temporary.name:
                cursor.execute("PRAGMA synchronous = OFF")
                cursor.execute("PRAGMA journal_mode = MEMORY")
        finally:
            cursor.close()

    event.listen(Engine, "connect", unsynced)
    try:
        store = _get_store(f"sqlite:///{temporary}")
        store.engine.dispose()
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.link(temporary, path)  # fails if another process linked its copy first: fine
    except FileExistsError:
        pass
    finally:
        event.remove(Engine, "connect", unsynced)
        temporary.unlink(missing_ok=True)


def create_new_store(uri: str) -> None:
    """A new SQLite store at ``uri``, a copy of the cached empty one, if there is one yet
    (otherwise MLflow's tracker builds it)."""
    path = new_sqlite_path(uri)
    if path is not None:
        copy_template(path)


def copy_template(path: Path) -> bool:
    """Place a copy of the cached empty database at ``path``; False when there is none."""
    import shutil
    import sqlite3

    template = template_path()
    if not template.exists():
        return False
    temporary = _temporary(path)
    try:
        shutil.copyfile(template, temporary)
        with sqlite3.connect(temporary) as connection:  # MLflow's "Default" experiment
            connection.execute(
                "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                (os.path.abspath(os.path.join("mlruns", "0")),),
            )
        connection.close()
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)
    return True


def write_ahead(uri: str) -> None:
    """This process's connections to the SQLite store at ``uri`` put it in write-ahead-log
    mode, synced at checkpoints only (``synchronous=NORMAL``): a trial's run takes a dozen
    commits, and each would otherwise wait for a disk the sweep's jobs keep busy.  A crash of
    any process loses no commit; a power cut may undo the last ones, which the next launch
    reconciles.  ``mlflow ui`` reading the store no longer blocks the sweep writing it.  Where
    the log cannot be made at once (a full disk, another process's transaction), the store
    keeps its rollback journal, synced at every commit."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    path = sqlite_file(uri)
    if path is None or path in _WRITTEN_AHEAD:
        return
    _WRITTEN_AHEAD.add(path)

    def log_ahead(connection: Any, _record: Any) -> None:
        import sqlite3

        if not isinstance(connection, sqlite3.Connection):
            return
        cursor = connection.cursor()
        try:
            files = [row[2] for row in cursor.execute("PRAGMA database_list") if row[1] == "main"]
            if not files or os.path.realpath(files[0]) != str(path):
                return
            (patience,) = cursor.execute("PRAGMA busy_timeout").fetchone()
            cursor.execute("PRAGMA busy_timeout = 0")  # never waits for another's transaction
            try:
                (mode,) = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
            except sqlite3.Error:
                mode = None
            finally:
                cursor.execute(f"PRAGMA busy_timeout = {int(patience)}")
            if mode == "wal":
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    event.listen(Engine, "connect", log_ahead)


_WRITTEN_AHEAD: set[Path] = set()


def leave_write_ahead(uri: str) -> None:
    """Return the SQLite store to its rollback journal (the log moved into the file), as
    MLflow leaves a store and as any reader opens it, even on a full disk.  Never waits: while
    another process has the store open, it stays in WAL mode (that process ends it); while its
    disk is full, its log and shared-memory files stay (readers need them then)."""
    import sqlite3

    from mlflow.tracking._tracking_service.utils import _get_store

    from paiexp.util.diskfull import nearly_full

    path = sqlite_file(uri)
    if path is None or not Path(f"{path}-wal").exists() or nearly_full(str(path.parent)):
        return
    _get_store(uri).engine.dispose()  # this process's connections closed
    connection = sqlite3.connect(path, timeout=0)
    try:
        connection.execute("PRAGMA journal_mode = DELETE")
    except sqlite3.Error:  # another process reads or writes it: it stays so
        pass
    finally:
        connection.close()
