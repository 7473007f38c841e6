"""A user's own project after a normal (non-editable) install: `paiexp init`, then a sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, clean_env, run_paiexp
from sweep_helpers import load_study

pytestmark = pytest.mark.slow


def pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        check=True,
        capture_output=True,
        timeout=600,
    )


@pytest.mark.timeout(900)  # builds and installs a wheel (pip may take minutes)
def test_init_writes_a_project_that_runs_from_a_normal_install(tmp_path: Path) -> None:
    pip("wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(REPO))
    (wheel,) = (tmp_path / "dist").glob("paiexp-*.whl")
    site = tmp_path / "site"
    pip("install", "--no-deps", "--target", str(site), str(wheel))
    env = clean_env(PYTHONPATH=str(site))

    where = subprocess.run(
        [sys.executable, "-c", "import paiexp; print(paiexp.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip() == str(site / "paiexp" / "__init__.py")

    project = tmp_path / "my-project"
    made = run_paiexp(tmp_path, "init", str(project), env=env)
    assert made.returncode == 0, made.stderr
    for part in (
        "conf/config.yaml",
        "sweeps/xgb.yaml",
        "examples/xgb/train.py",
        "examples/xgb/data/train.csv",
        ".gitignore",
    ):
        assert (project / part).is_file(), part
    assert (project / "conf/job/xgb.yaml").read_text() == (REPO / "conf/job/xgb.yaml").read_text()

    again = run_paiexp(tmp_path, "init", str(project), env=env)
    assert again.returncode == 2
    assert again.stderr.startswith("paiexp: error: init:") and again.stderr.count("\n") == 1

    swept = run_paiexp(project, "+sweep=xgb", "sweep.n_trials=2", env=env)
    assert swept.returncode == 0, swept.stderr
    study = load_study(project, "xgb")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert (project / "mlflow.db").is_file() and (project / ".paiexp" / "jobs").is_dir()
