"""A new SQLite tracking store, made fast and whole: MLflow's schema is built once per machine
and MLflow version as a cached empty database (seconds of migrations), and each new
``mlflow.db`` is an atomic copy of it; a launcher killed meanwhile leaves no half-built file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from paiexp.cache import cache_root


def new_sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI that does not exist yet (None otherwise)."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    path = Path(uri.removeprefix("sqlite:///")).resolve()
    return None if path.exists() else path


def template_path() -> Path:
    """An empty tracking database of the installed MLflow version, built once per machine."""
    from importlib.metadata import version

    return cache_root() / f"mlflow-{version('mlflow')}-empty.db"


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

    temporary = path.with_name(f".{path.name}.{os.getpid()}.creating")

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


def copy_template(path: Path) -> bool:
    """Place a copy of the cached empty database at ``path``; False when there is none."""
    import shutil
    import sqlite3

    template = template_path()
    if not template.exists():
        return False
    temporary = path.with_name(f".{path.name}.{os.getpid()}.creating")
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
