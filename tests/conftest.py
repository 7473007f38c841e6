from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from image_tags import docker_image_tag, hydra_image_tag, mlflow_image_tag, torch_image_tag

pytest_plugins = ["cli_backends"]  # the cli_backend fixture: one scenario on every backend

REPO = Path(__file__).resolve().parents[1]
# The sweeps this project ships, as paiexp lists them in its "available: ..." errors.
SHIPPED_SWEEPS = ", ".join(sorted(path.stem for path in (REPO / "sweeps").glob("*.yaml")))

T = TypeVar("T")


# -- waiting: every wait in the tests has a deadline and says what never happened -------------


def wait_until(
    predicate: Callable[[], T], timeout: float = 60.0, what: str = "", interval: float = 0.05
) -> T:
    """Call ``predicate`` until it returns something true, and return that; fail the test
    saying ``what`` never happened if ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(
                f"{what or getattr(predicate, '__name__', 'the condition')} "
                f"did not happen within {timeout} s"
            )
        time.sleep(interval)


def job_end(backend: Any, handle: Any, timeout: float = 60.0) -> Any:
    """A backend's job's final status (its ``poll`` and ``wait``, as a launcher follows it)."""

    def ended() -> Any:
        status = backend.poll([handle])[handle.id]
        if status.state.terminal:
            return status
        backend.wait([handle], 0.5)
        return None

    return wait_until(ended, timeout, f"job {handle.name} to end", interval=0)


def assert_stays(predicate: Callable[[], object], seconds: float, what: str) -> None:
    """``predicate`` holds throughout ``seconds`` (checking that nothing happens: there is
    no event to wait for, only a window to watch)."""
    deadline = time.monotonic() + seconds
    while True:
        assert predicate(), f"{what} no longer held"
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


# -- shared platforms: one emulator and one image check per session -----------------------------


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The test image in a running engine. Without either, the docker tests FAIL (never skip,
    in CI or anywhere): deselect them explicitly with ``-m 'not docker'``."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.fail(f"no Docker engine answers: {exc} (deselect with -m 'not docker')")
    tag = docker_image_tag()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the test image {tag} is missing: run bash tests/images/build.sh")
    return tag


@pytest.fixture(scope="session")
def torch_image(docker_image: str) -> str:
    """The torch variant of the test image (Debian's python3-torch, for the DDP example in
    containers): fails, never skips, without it."""
    import docker

    tag = torch_image_tag()
    try:
        docker.from_env().images.get(tag)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the torch test image {tag} is missing: run bash tests/images/build-torch.sh")
    return tag


@pytest.fixture(scope="session")
def mlflow_image(docker_image: str) -> str:
    """The mlflow variant of the test image (mlflow-skinny and scikit-learn, for scripts that
    make their own MLflow calls in containers): fails, never skips, without it."""
    import docker

    tag = mlflow_image_tag()
    try:
        docker.from_env().images.get(tag)
    except docker.errors.ImageNotFound:
        build = "bash tests/images/build-mlflow.sh"
        pytest.fail(f"the mlflow test image {tag} is missing: run {build}")
    return tag


@pytest.fixture(scope="session")
def hydra_image(docker_image: str) -> str:
    """The hydra variant of the test image (Hydra, OmegaConf, cloudpickle; never paiexp), for
    a Hydra app's jobs in containers: fails, never skips, without it."""
    import docker

    tag = hydra_image_tag()
    try:
        docker.from_env().images.get(tag)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the hydra test image {tag} is missing: run bash tests/images/build-hydra.sh")
    return tag


@pytest.fixture(scope="session")
def pai_cloud(tmp_path_factory: pytest.TempPathFactory, docker_image: str) -> Iterator[Any]:
    """One PAI + OSS emulator for the session (tests that count its jobs or requests start
    their own), its jobs in containers of the test image. Job names must be unique across
    the tests that share it."""
    from emulator import Emulator

    root = tmp_path_factory.mktemp("pai-cloud")
    with Emulator(root, local_images={"default": docker_image}) as emulator:
        yield emulator
        assert not emulator.pai.leaked_containers()
    assert not emulator.pai.containers()  # the rest removed when it stopped


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the repository's project files (conf/, examples/) in a fresh directory."""
    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, tmp_path / name)
    return tmp_path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(extra)
    return env


def run_paiexp(
    cwd: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paiexp", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or clean_env(),
    )


LEFTOVERS = ("mlflow.db", ".paiexp", "mlruns", "optuna.journal")


def assert_nothing_started(directory: Path) -> None:
    """No MLflow store, job directory or study was created in ``directory``."""
    for name in LEFTOVERS:
        assert not (directory / name).exists(), f"{name} was created in {directory}"


ERROR_PREFIX = "paiexp: error: "


def assert_one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error line of a user mistake, after checking the whole contract but its content:
    one line on stderr, nothing on stdout, no traceback, exit code 2."""
    assert "Traceback" not in done.stderr, done.stderr
    assert "Traceback" not in done.stdout, done.stdout
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{done.stderr}"
    line = lines[0]
    assert line.startswith(ERROR_PREFIX), line
    assert line[len(ERROR_PREFIX) :].strip(), line
    assert done.returncode == 2, done.stderr
    return line


HEAVY_MODULES = ("mlflow", "optuna", "docker", "alibabacloud_paistudio20220112", "oss2")


def run_without_heavy_imports(
    cwd: Path, calls: list[tuple[list[str], int]]
) -> subprocess.CompletedProcess[str]:
    """Run ``paiexp.cli.main(argv)`` for each call in one fresh interpreter, check each exit
    code, then check that none of the heavy libraries was imported (a typo is reported at
    once). The process fails if anything does not hold."""
    script = "\n".join(
        [
            "import os, sys",
            f"os.chdir({str(cwd)!r})",
            "from paiexp.cli import main",
            *(f"assert main({argv!r}) == {code}, {argv!r}" for argv, code in calls),
            f"heavy = {HEAVY_MODULES!r}",
            "loaded = sorted(n for n in sys.modules",
            "                if any(n == h or n.startswith(h + '.') for h in heavy))",
            "assert not loaded, f'heavy modules imported: {loaded}'",
        ]
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def mlflow_client(directory: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")


def all_runs(directory: Path) -> list:
    client = mlflow_client(directory)
    experiments = client.search_experiments()
    return client.search_runs([e.experiment_id for e in experiments]) if experiments else []


# Fixtures that start a server process of their own (PostgreSQL, MLflow, Chromium).
SERVER_FIXTURES = frozenset({"postgres", "tracking_server", "mlflow_server", "chromium"})


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need the Docker engine and image are marked ``docker``, those that start
    servers ``servers``; the rest, unless ``slow``, are the fast loop's (``-m fast``)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "docker_image" in fixtures:
            item.add_marker(pytest.mark.docker)
        if fixtures & SERVER_FIXTURES:
            item.add_marker(pytest.mark.servers)
        if not any(item.get_closest_marker(m) for m in ("slow", "docker", "servers")):
            item.add_marker(pytest.mark.fast)


# -- a small disk to fill up ---------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs (root mounts one; anyone else fails here, saying so)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs, which needs root: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill_disk(disk: Path) -> None:
    """Take every byte the file system has left."""
    with open(disk / "ballast", "wb", buffering=0) as ballast:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    ballast.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc


# Real servers (PostgreSQL, an MLflow server backed by it): session fixtures of tests/servers.py.
from servers import mlflow_server, postgres, tracking_server  # noqa: E402, F401
