from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
