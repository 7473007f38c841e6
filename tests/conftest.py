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


def mlflow_client(directory: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")


def all_runs(directory: Path) -> list:
    client = mlflow_client(directory)
    experiments = client.search_experiments()
    return client.search_runs([e.experiment_id for e in experiments]) if experiments else []
