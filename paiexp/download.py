"""``paiexp download``: fetch a tracked run's output channel (its model by default).

A run in a local SQLite tracking store (the default ``mlflow.db``) is read straight from the
database, read-only, and its stored config from its artifact directory: no MLflow import, so
fetching a local model takes a fraction of a second after composing the config.  Any other
store (a tracking server, PostgreSQL, an artifact store elsewhere) is read through MLflow.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from paiexp.confine import copy_tree, inside
from paiexp.errors import UserError
from paiexp.redact import redact_url
from paiexp.tracking import CONFIG_ARTIFACT, tracking_uri

OUTPUT_TAG_PREFIX = "paiexp.output."


@dataclass(frozen=True)
class StoredRun:
    run_id: str
    tags: dict[str, str]
    config_text: Callable[[], str]  # the resolved config the run stored, read when needed


def fetch_output(
    config: Any, run_id: str, channel: str, dest: Path, overrides: Sequence[str] = ()
) -> tuple[str, list[Path]]:
    """Download run ``run_id``'s output ``channel`` into ``dest``: (its URI, the files).

    ``config``: the project's (its tracker); ``overrides``: edits of the run's stored
    config, whose backend settings reach OSS.
    """
    uri = tracking_uri(config.tracker.uri)
    database = sqlite_file(uri)
    run: StoredRun | None = None
    if database is not None:
        try:
            run = sqlite_run(database, run_id)
        except sqlite3.Error:
            database = None  # not a store this module can read: MLflow's client can
    if database is None:
        run = mlflow_run(config, run_id)
    if run is None:
        raise UserError(f"run_id: no MLflow run {run_id!r} in {redact_url(uri)}")
    output = output_uri(run.tags, run.run_id, channel)
    backend = None
    if output.startswith("oss://") or overrides:
        from paiexp.compose import from_yaml, to_object

        backend = to_object(from_yaml(run.config_text(), overrides)).backend
    return output, download(output, dest, backend)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path).absolute()


def sqlite_run(database: Path, run_id: str) -> StoredRun | None:
    """A run of an MLflow SQLite store, read-only (None when it has no such run, or the
    file does not exist); sqlite3.Error when the file is not such a store."""
    if not database.is_file():
        return None
    with sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True) as connection:
        row = connection.execute(
            "SELECT artifact_uri FROM runs WHERE run_uuid = ?", (run_id,)
        ).fetchone()
        if row is None:
            return None
        tags = connection.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,))
        load = partial(artifact_text, str(row[0] or ""), CONFIG_ARTIFACT)
        return StoredRun(run_id, {str(k): str(v) for k, v in tags}, load)


def mlflow_run(config: Any, run_id: str) -> StoredRun | None:
    """A run of any store, through MLflow's client."""
    from paiexp.runs import open_tracker

    tracker = open_tracker(config)
    tracked = tracker.get_run(run_id)
    if tracked is None:
        return None
    return StoredRun(run_id, tracked.tags, partial(tracker.load_text, run_id, CONFIG_ARTIFACT))


def artifact_text(artifact_uri: str, artifact: str) -> str:
    """An artifact's text: read from the run's directory when local, else through MLflow."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path) if parsed.scheme else artifact_uri) / artifact
        try:
            return path.read_text()
        except OSError as exc:
            raise UserError(f"the run's {artifact} cannot be read: {exc}") from None
    import mlflow

    return str(mlflow.artifacts.load_text(f"{artifact_uri}/{artifact}"))


def output_uri(tags: dict[str, str], run_id: str, channel: str) -> str:
    uri = tags.get(f"{OUTPUT_TAG_PREFIX}{channel}")
    if not uri:
        known = sorted(
            k.removeprefix(OUTPUT_TAG_PREFIX) for k in tags if k.startswith(OUTPUT_TAG_PREFIX)
        )
        raise UserError(
            f"--channel: run {run_id} has no output channel {channel!r}"
            + (f"; it has {', '.join(known)}" if known else " (the job may not have finished)")
        )
    return uri


def download(uri: str, dest: Path, backend_config: Any) -> list[Path]:
    """Copy ``uri`` (an ``oss://`` object or prefix, or a local path) into ``dest``."""
    if uri.startswith("oss://"):
        from paiexp.backends.pai import make_transfer
        from paiexp.credentials import credential_client
        from paiexp.oss import OssUri

        if getattr(backend_config, "name", None) != "pai":
            raise UserError(f"cannot download {uri}: the run's backend has no OSS settings")
        transfer = make_transfer(backend_config, credential_client())
        return transfer.download(OssUri.parse(uri), dest)
    source = Path(uri.removeprefix("file://"))
    if not source.exists():
        raise UserError(f"the run's output {source} no longer exists")
    if source.is_file():
        target = inside(dest, source.name, name=str(source))
        dest.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy2(source, target))]
    return sorted(copy_tree(source, dest))
