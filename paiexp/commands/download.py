"""``paiexp download``: fetch a tracked run's output channel (its model by default).

A run in a local SQLite tracking store (the default ``mlflow.db``) is read straight from the
database, read-only, and its stored config from its artifact directory: no MLflow import, so
fetching a local model takes a fraction of a second after composing the config.  Any other
store (a tracking server, PostgreSQL, an artifact store elsewhere) is read through MLflow.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from paiexp.errors import UserError
from paiexp.tracking.mlflow_tracker import (
    BEST_RUN_TAG,
    BEST_TAG,
    CONFIG_ARTIFACT,
    KIND_TAG,
    PARENT_RUN_TAG,
    STEP_TAG,
    STUDY_NAME_TAG,
    tracking_uri,
)
from paiexp.util.confine import copy_tree, inside
from paiexp.util.redact import redact_url

OUTPUT_TAG_PREFIX = "paiexp.output."


RUN_ID = re.compile(r"[0-9a-f]{32}")
SWEEP_NAME = re.compile(r"[\w.-]+")


@dataclass(frozen=True)
class StoredRun:
    run_id: str
    tags: dict[str, str]
    config_text: Callable[[], str]  # the resolved config the run stored, read when needed


class RunStore(Protocol):
    """The tracking store's runs, as ``paiexp download`` reads them."""

    def get(self, run_id: str) -> StoredRun | None:
        """The run with this id (None: no such run)."""

    def tagged(self, tags: Mapping[str, str]) -> list[StoredRun]:
        """The runs (of any experiment) that carry every one of ``tags``, the newest first."""


def fetch_output(
    config: Any,
    target: str,
    channel: str,
    dest: Path,
    overrides: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> tuple[str, list[Path]]:
    """Download ``target``'s output ``channel`` into ``dest``: (its URI, the files).

    ``target``: a run id (a sweep's parent run: its best trial's), or a sweep's study name
    (its newest parent run's best trial).  ``config``: the project's (its tracker);
    ``overrides``: edits of the run's stored config, whose backend settings reach OSS.
    ``say`` tells which run it is when that is not ``target`` itself.
    """
    uri = tracking_uri(config.tracker.uri)
    runs = run_store(config, uri)
    run = runs.get(target) if RUN_ID.fullmatch(target) else None
    if run is None:
        run = sweep_by_name(runs, target, uri)
    run = own_outputs(runs, run, say)
    output = output_uri(run.tags, run.run_id, channel)
    backend = None
    if output.startswith("oss://") or overrides:
        from paiexp.config.compose import from_yaml, to_object

        backend = to_object(from_yaml(run.config_text(), overrides)).backend
    return output, download(output, dest, backend)


def run_store(config: Any, uri: str) -> RunStore:
    """The runs of a local SQLite store read straight from its file; any other's through
    MLflow's client."""
    database = sqlite_file(uri)
    if database is not None:
        store = SqliteRuns(database)
        if store.readable():
            return store
    return MlflowRuns(config)


def sweep_by_name(runs: RunStore, name: str, uri: str) -> StoredRun:
    """The newest parent run of the sweep whose study is called ``name``."""
    if SWEEP_NAME.fullmatch(name):
        found = runs.tagged({KIND_TAG: "sweep", STUDY_NAME_TAG: name})
        if found:
            return found[0]
    raise UserError(
        f"RUN_ID: no MLflow run {name!r} and no sweep whose study is {name!r} in "
        f"{redact_url(uri)}; give a run id or a sweep's study name"
    )


def own_outputs(runs: RunStore, run: StoredRun, say: Callable[[str], None]) -> StoredRun:
    """The run whose outputs ``run`` stands for: a sweep's parent run, its best trial's
    (said so in one line); a pipeline's parent run has none (a UserError naming its steps'
    runs); any other run, itself."""
    kind = run.tags.get(KIND_TAG)
    if kind == "sweep":
        study = run.tags.get(STUDY_NAME_TAG, "?")
        best_id = run.tags.get(BEST_RUN_TAG)
        best = runs.get(best_id) if best_id else None
        if best is None:
            found = runs.tagged({PARENT_RUN_TAG: run.run_id, BEST_TAG: "true"})
            best = found[0] if found else None
        if best is None:
            raise UserError(
                f"RUN_ID: run {run.run_id} is the parent run of sweep {study}, "
                "and none of its trials has completed"
            )
        trial = best.tags.get("paiexp.trial_number", "?")
        say(
            f"run {run.run_id} is the parent run of sweep {study}: "
            f"its best trial is trial {trial}, run {best.run_id}"
        )
        return best
    if kind == "pipeline":
        steps = runs.tagged({PARENT_RUN_TAG: run.run_id})
        named = ", ".join(
            f"{s.tags.get(STEP_TAG, '?')} {s.run_id}" for s in reversed(steps) if STEP_TAG in s.tags
        )
        raise UserError(
            f"RUN_ID: run {run.run_id} is the parent run of pipeline "
            f"{run.tags.get('paiexp.pipeline', '?')}, which has no outputs of its own; "
            + (f"give one of its steps' runs: {named}" if named else "none of its steps has run")
        )
    return run


class SqliteRuns:
    """A local SQLite tracking store, read-only, without MLflow."""

    def __init__(self, database: Path) -> None:
        self.database = database

    def readable(self) -> bool:
        """Whether the file is an MLflow store this class reads (a missing file is an empty
        store)."""
        if not self.database.is_file():
            return True
        try:
            with self._connect() as connection:
                connection.execute("SELECT run_uuid, artifact_uri FROM runs LIMIT 1")
                connection.execute("SELECT run_uuid, key, value FROM tags LIMIT 1")
        except sqlite3.Error:
            return False
        return True

    def get(self, run_id: str) -> StoredRun | None:
        if not self.database.is_file():
            return None
        with self._connect() as connection:
            return self._stored(connection, run_id)

    def tagged(self, tags: Mapping[str, str]) -> list[StoredRun]:
        if not self.database.is_file():
            return []
        matches = " AND ".join(
            "EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ? "
            "AND t.value = ?)"
            for _ in tags
        )
        query = (
            f"SELECT r.run_uuid FROM runs r WHERE r.lifecycle_stage = 'active' AND {matches} "
            "ORDER BY r.start_time DESC"
        )
        values = [item for pair in tags.items() for item in pair]
        with self._connect() as connection:
            ids = [row[0] for row in connection.execute(query, values)]
            return [run for run in (self._stored(connection, i) for i in ids) if run]

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"{self.database.as_uri()}?mode=ro", uri=True)

    @staticmethod
    def _stored(connection: sqlite3.Connection, run_id: str) -> StoredRun | None:
        row = connection.execute(
            "SELECT artifact_uri FROM runs WHERE run_uuid = ?", (run_id,)
        ).fetchone()
        if row is None:
            return None
        tags = connection.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,))
        load = partial(artifact_text, str(row[0] or ""), CONFIG_ARTIFACT)
        return StoredRun(run_id, {str(k): str(v) for k, v in tags}, load)


class MlflowRuns:
    """Any tracking store, through MLflow's client."""

    def __init__(self, config: Any) -> None:
        from paiexp.runs import open_tracker

        self.tracker = open_tracker(config)

    def get(self, run_id: str) -> StoredRun | None:
        tracked = self.tracker.get_run(run_id)
        return self._stored(tracked.run_id, tracked.tags) if tracked else None

    def tagged(self, tags: Mapping[str, str]) -> list[StoredRun]:
        return [self._stored(t.run_id, t.tags) for t in self.tracker.runs_tagged_anywhere(tags)]

    def _stored(self, run_id: str, tags: dict[str, str]) -> StoredRun:
        return StoredRun(run_id, tags, partial(self.tracker.load_text, run_id, CONFIG_ARTIFACT))


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path).absolute()


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
            + (f"; it has {', '.join(known)}" if known else f" ({_why_none(tags)})")
        )
    return uri


def _why_none(tags: Mapping[str, str]) -> str:
    """Why a run has no outputs at all."""
    if "paiexp.job_name" not in tags:
        return "it tracks no paiexp job"
    if tags.get("paiexp.status") in (None, "SUBMITTED", "PENDING", "RUNNING"):
        return f"its job has not finished: paiexp attach {tags['paiexp.job_name']}"
    return f"its job ended {tags.get('paiexp.status')} and recorded none"


def download(uri: str, dest: Path, backend_config: Any) -> list[Path]:
    """Copy ``uri`` (an ``oss://`` object or prefix, or a local path) into ``dest``."""
    if uri.startswith("oss://"):
        from paiexp.backends.pai import make_transfer
        from paiexp.cloud.credentials import credential_client
        from paiexp.cloud.oss import OssUri

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
