"""Real servers for the tests: a PostgreSQL cluster, and an MLflow tracking server on it.

PostgreSQL comes from Debian's packages (``apt-get install postgresql``, which ``.ci/run``
does): a cluster in a temporary directory, run by an unprivileged user (``postgres`` when the
tests run as root, as CI does), listening on a free loopback port, stopped afterwards.  The
MLflow server keeps its runs in a database of that cluster and its artifacts in a temporary
directory.  The tests that use them FAIL without them, never skip.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from conftest import wait_until

PG_BINARIES = "/usr/lib/postgresql"  # Debian's: <version>/bin/{initdb,postgres}
PG_SUPERUSER = "paiexp"
# trust: a loopback-only cluster of a test; no fsync: nothing in it outlives the session
INITDB_OPTIONS = ("-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pg_bindir() -> Path:
    """The newest installed PostgreSQL's binaries; the test fails without any."""
    versions = sorted(Path(PG_BINARIES).glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    if not versions:
        pytest.fail(f"no PostgreSQL server under {PG_BINARIES}: apt-get install postgresql")
    return versions[-1].parent


class Postgres:
    """A throwaway cluster: ``url(name)`` of a database, made by :meth:`database`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bindir = pg_bindir()
        # initdb and postgres refuse root: run them as Debian's postgres user then
        self.user = "postgres" if os.geteuid() == 0 else None
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None

    def _as_user(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        try:
            entry = pwd.getpwnam(self.user)
        except KeyError:
            pytest.fail(f"no {self.user!r} user to run PostgreSQL as: apt-get install postgresql")
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def start(self) -> None:
        """A new cluster, running."""
        as_user = self._as_user()
        if as_user:
            shutil.chown(self.root, user=self.user, group=self.user)
        subprocess.run(
            [self.bindir / "initdb", "-D", self.root / "data", "-U", PG_SUPERUSER, *INITDB_OPTIONS],
            check=True,
            capture_output=True,
            **as_user,
        )
        self.run()

    def run(self) -> None:
        """The server of the cluster, started (again: an outage ends) on the same port."""
        as_user = self._as_user()
        data = self.root / "data"
        self.log = open(self.root / "server.log", "ab")  # noqa: SIM115 (closed in stop)
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "max_connections": "200",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
        }
        options = [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        self.process = subprocess.Popen(
            [self.bindir / "postgres", "-D", data, "-p", str(self.port), *options],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **as_user,
        )
        wait_until(self._ready, 60, "PostgreSQL to accept connections", interval=0.1)

    def _ready(self) -> bool:
        import psycopg

        assert self.process is not None
        if self.process.poll() is not None:
            log = (self.root / "server.log").read_text(errors="replace")
            pytest.fail(f"PostgreSQL exited with {self.process.returncode}:\n{log}")
        try:
            psycopg.connect(self.url("postgres"), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def url(self, database: str) -> str:
        return f"postgresql://{PG_SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.close()


def server_env() -> dict[str, str]:
    """An MLflow server's environment: none of this process's ``MLFLOW_*``, and no job
    execution (MLflow 3's huey consumers poll for jobs no test asks for, and outlive a server
    stopped by its pid alone)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    return env


class MlflowServer:
    """``mlflow server`` on a backend store URI; stopped and started again on the same port
    (an outage), its runs kept in the store."""

    def __init__(self, backend_store: str, artifacts: Path) -> None:
        self.backend_store = backend_store
        self.artifacts = artifacts
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180) -> None:
        log = open(self.artifacts.parent / "mlflow-server.log", "ab")  # noqa: SIM115
        with log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "mlflow", "server"),
                    *("--backend-store-uri", self.backend_store),
                    *("--artifacts-destination", str(self.artifacts)),
                    *("--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=server_env(),
            )
        wait_until(self._healthy, timeout, f"mlflow server at {self.uri} to answer /health")

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = (self.artifacts.parent / "mlflow-server.log").read_text(errors="replace")
            pytest.fail(f"mlflow server exited with {self.process.returncode}:\n{log[-4000:]}")
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)  # the server and its workers
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextmanager
def running_postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster of its own, stopped and removed afterwards; not under pytest's
    temporary root, which is private to the user running the tests."""
    server = Postgres(Path(tempfile.mkdtemp(prefix="paiexp-pg-")))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster for the session (each test makes its own databases)."""
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def tracking_server(
    postgres: Postgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowServer]:
    """An MLflow tracking server whose backend store is a PostgreSQL database; a test that
    stops it starts it again before it ends."""
    root = tmp_path_factory.mktemp("mlflow-server")
    server = MlflowServer(postgres.database("mlflow"), root / "artifacts")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def mlflow_server(tracking_server: MlflowServer) -> str:
    """The URI of the tracking server."""
    return tracking_server.uri
