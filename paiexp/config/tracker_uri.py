"""Which tracking URIs MLflow opens (and which database URLs SQLAlchemy does), told before
any job or run exists, without importing MLflow.

MLflow 3.17 picks a tracking store by the URI's scheme (``_register_tracking_stores`` in
``mlflow.tracking._tracking_service.utils``; the scheme as ``mlflow.utils.uri.get_uri_scheme``
reads it, lower case, a Windows drive letter none): a database (``postgresql``, ``mysql``,
``sqlite``, ``mssql``, each with an optional ``+DRIVER``, as SQLAlchemy names them), a
tracking server (``http``, ``https``), Databricks (``databricks``, ``databricks://PROFILE``),
or, for a path or a ``file:`` URI, its file store, which it refuses to open unless
``MLFLOW_ALLOW_FILE_STORE`` is true: a bare word such as ``pai`` is such a path.
``databricks-uc`` and ``uc`` name model registries it refuses as tracking stores, and any
other scheme is a plugin's (entry points ``mlflow.tracking_store``) or no store at all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from paiexp.errors import UserError
from paiexp.util.redact import redact_urls
from paiexp.util.seconds import check_seconds

if TYPE_CHECKING:
    from paiexp.config.schema import TrackerConfig

DATABASES = ("postgresql", "mysql", "sqlite", "mssql")  # mlflow.store.db.db_types
SERVERS = ("http", "https")
FILE_STORE = ("", "file")
DATABRICKS = "databricks"
UNITY_CATALOG = ("databricks-uc", "uc")
IN_MEMORY = ("", ":memory:")  # the paths of an SQLite database in memory
SQLITE_HEADER = b"SQLite format 3\x00"
MAX_EXPERIMENT_NAME = 500  # characters: mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH
VALID = (
    "null (sqlite:///mlflow.db in the working directory), sqlite:///PATH, "
    "postgresql://, mysql:// or mssql://USER@HOST/DATABASE, http(s)://HOST:PORT "
    "(an MLflow server) or databricks"
)


def tracking_uri(uri: str | None, base_dir: Path | None = None) -> str:
    """The tracking URI MLflow uses for ``tracker.uri``, known without importing MLflow:
    ``uri``, else ``$MLFLOW_TRACKING_URI``, else sqlite:///mlflow.db in ``base_dir`` (default:
    the working directory, where the command runs)."""
    default = Path(os.path.abspath(base_dir or ".")) / "mlflow.db"
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{default}"


def check_tracker(tracker: TrackerConfig) -> None:
    """The ``tracker`` settings: its URI (see :func:`check_tracking_uri`), an experiment name
    MLflow takes, a finite ``outage_timeout``."""
    check_tracking_uri(tracker.uri)
    if not tracker.experiment or len(tracker.experiment) > MAX_EXPERIMENT_NAME:
        raise UserError(
            f"tracker.experiment: invalid value {tracker.experiment!r}; expected an MLflow "
            f"experiment name of 1 to {MAX_EXPERIMENT_NAME} characters"
        )
    check_seconds("tracker.outage_timeout", tracker.outage_timeout)
    check_job_uri(tracker.job_uri, tracker.uri)


def check_job_uri(job_uri: str | None, configured: str | None) -> None:
    """``tracker.job_uri``: an http(s) URI of a server, without a password (jobs get the
    launcher's ``MLFLOW_TRACKING_*`` credentials in their environment), for a tracker that is
    a server (``configured``: ``tracker.uri``)."""
    if job_uri is None:
        return
    try:
        parts = urlsplit(job_uri)
        valid = parts.scheme.lower() in SERVERS and bool(parts.hostname) and parts.port != 0
    except ValueError:
        valid = False
    if not valid:
        raise UserError(
            f"tracker.job_uri: invalid value {redact_urls(job_uri)!r}; expected null or "
            "http(s)://HOST[:PORT], the tracking server as the jobs reach it"
        )
    if parts.password:
        raise UserError(
            f"tracker.job_uri: {redact_urls(job_uri)!r} holds a password; expected the URI "
            "alone (jobs get MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD from the "
            "launcher's environment)"
        )
    uri = tracking_uri(configured)
    if uri_scheme(uri) not in SERVERS:
        raise UserError(
            f"tracker.job_uri: jobs write to a tracking server only, and tracker.uri is "
            f"{redact_urls(uri)!r}; expected null, or tracker.uri set to that server"
        )


def check_tracking_uri(configured: str | None) -> None:
    """``tracker.uri`` (``configured``; null: ``$MLFLOW_TRACKING_URI`` or the default) names
    a tracking store MLflow opens; else a UserError naming it and what would be valid."""
    uri = tracking_uri(configured)
    problem = uri_problem(uri)
    if problem:
        from_environment = not configured and os.environ.get("MLFLOW_TRACKING_URI")
        key = "MLFLOW_TRACKING_URI" if from_environment else "tracker.uri"
        raise UserError(f"{key}: {redact_urls(uri)!r} {problem}; expected {VALID}")


def uri_scheme(uri: str) -> str:
    """The scheme MLflow chooses a store by ('' for a path); ValueError for no URI at all."""
    scheme = urlsplit(uri).scheme.lower()
    return "" if len(scheme) == 1 and scheme.isalpha() else scheme


def database_engine(uri: str) -> str | None:
    """``postgresql``, ``mysql``, ``sqlite`` or ``mssql`` for a database's URI, else None."""
    try:
        engine = uri_scheme(uri).partition("+")[0]
    except ValueError:
        return None
    return engine if engine in DATABASES else None


def is_databricks(uri: str) -> bool:
    """Whether ``uri`` is Databricks' (``databricks``, ``databricks://PROFILE``)."""
    try:
        return DATABRICKS in (uri, uri_scheme(uri))
    except ValueError:
        return False


def uri_problem(uri: str) -> str | None:
    """Why MLflow would not open ``uri`` as a tracking store, or None."""
    try:
        scheme = uri_scheme(uri)
        host = urlsplit(uri).hostname
    except ValueError as exc:
        return f"is not a URI ({exc})"
    if is_databricks(uri):
        return None
    if uri in UNITY_CATALOG or scheme in UNITY_CATALOG:
        return "names a Unity Catalog model registry, which MLflow does not track runs in"
    if scheme in FILE_STORE:
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
            return None
        return (
            "is a local path: MLflow would keep runs there as files, in its file store, "
            "which it refuses unless MLFLOW_ALLOW_FILE_STORE=true"
        )
    if scheme in SERVERS:
        return None if host else "names no host"
    if any(scheme.startswith(engine) for engine in DATABASES):
        return _database_problem(uri, scheme)
    if scheme in _plugin_schemes():
        return None
    return f"has the scheme {scheme!r}, which no MLflow tracking store takes"


def _plugin_schemes() -> set[str]:
    """The schemes installed plugins add to MLflow's tracking stores."""
    from importlib.metadata import entry_points

    return {entry.name for entry in entry_points(group="mlflow.tracking_store")}


def _database_problem(uri: str, scheme: str) -> str | None:
    """Why SQLAlchemy and MLflow would not open a database URI, or None (whether its server
    answers is asked later, with the network: ``check_tracking_server``)."""
    engine, _, driver = scheme.partition("+")
    if engine not in DATABASES or "+" in driver:
        return f"names no database MLflow knows ({', '.join(DATABASES)}, each with +DRIVER or not)"
    return database_url_problem(uri)


def database_url_problem(url: str) -> str | None:
    """Why SQLAlchemy would not open the database ``url`` (an SQLite one: also a file it can
    neither open nor make), or None; its server, if any, is not asked."""
    try:
        scheme = uri_scheme(url)
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if scheme.partition("+")[0] == "sqlite":
        problem = _sqlite_problem(url)
        if problem or scheme == "sqlite":  # plain sqlite: Python's own sqlite3
            return problem
    return _driver_problem(url)


def _driver_problem(uri: str) -> str | None:
    """Why SQLAlchemy cannot parse ``uri`` or load its dialect and driver, or None."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
        url.get_dialect().import_dbapi()
    except NoSuchModuleError:
        return "names a database or driver SQLAlchemy does not have"
    except ImportError as exc:
        return f"needs the database driver {exc.name or exc}, which is not installed"
    except (ArgumentError, ValueError) as exc:
        return f"is not a database URL ({str(exc).splitlines()[0]})"
    return None


def _sqlite_problem(uri: str) -> str | None:
    """Why an ``sqlite`` URI names no database file paiexp can open or create, or None."""
    rest = uri.partition(":")[2]
    if not rest.startswith("///"):
        if rest == "//":
            return "is an SQLite database in memory, which keeps nothing once paiexp exits"
        return "is not sqlite:///PATH (a relative path) or sqlite:////PATH (an absolute one)"
    path = rest[3:].partition("?")[0]
    if path in IN_MEMORY:
        return "is an SQLite database in memory, which keeps nothing once paiexp exits"
    try:
        return _database_file_problem(Path(path))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"names no usable file ({reason})"


def _database_file_problem(path: Path) -> str | None:
    """Why ``path`` is no SQLite database, nor can become one, or None.  Its directory must
    exist (MLflow would make it: paiexp, which makes a new store itself, takes a missing one
    for a mistake)."""
    if path.exists():
        if not path.is_file():
            return f"names {str(path)!r}, which is not a file"
        with open(path, "rb") as stream:
            header = stream.read(len(SQLITE_HEADER))
        if header and header != SQLITE_HEADER:
            return f"names {str(path)!r}, which is not an SQLite database"
        return None
    directory = path.absolute().parent
    if not directory.is_dir():
        return f"is in {str(directory)!r}, which is not an existing directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"cannot be created: the directory {str(directory)!r} is not writable"
    return None
