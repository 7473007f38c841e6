"""`paiexp report`: a sweep's top trials in the terminal and one self-contained HTML file of
its plots, written locally and logged to the sweep's parent run (once, however often)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    REPO,
    SHIPPED_SWEEPS,
    assert_nothing_started,
    assert_one_line_error,
    mlflow_client,
    run_paiexp,
)
from sweep_helpers import load_study, sweep_runs

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

PLOTS = (
    "Optimization history of test-auc",
    "Parameter importances (PED-ANOVA) of test-auc",
    "Parallel coordinates of test-auc",
    "Slices of test-auc",
    "Trial states and durations",
)


def xgb_project(root: Path) -> Path:
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, root / name)
    return root


def report_artifacts(root: Path, run_id: str) -> list[str]:
    return [a.path for a in mlflow_client(root).list_artifacts(run_id, "report")]


@pytest.mark.slow
def test_report_of_a_sweep_writes_its_plots_and_logs_one_artifact(tmp_path: Path) -> None:
    root = xgb_project(tmp_path)
    swept = run_paiexp(root, "+sweep=xgb", "sweep.n_trials=3", "sweep.parallelism=3")
    assert swept.returncode == 0, swept.stderr
    study = load_study(root, "xgb")
    (parent,), children = sweep_runs(root)

    first = run_paiexp(root, "report", "xgb")
    assert first.returncode == 0, first.stderr
    assert "top trials of study xgb" in first.stdout
    best = study.best_trial
    assert re.search(rf"│\s+{best.number} │ {best.value:.6g} ", first.stdout), first.stdout
    page = root / "reports" / "xgb.html"
    assert f"report: {page}" in first.stdout
    text = page.read_text()
    for title in PLOTS:
        assert f"<h2>{title}</h2>" in text
    assert "not drawn" not in text
    assert text.count("Plotly.newPlot(") == len(PLOTS)
    assert not re.search(r"<script[^>]+src=", text)  # plotly.js inline: no fetch, works offline
    assert len(text) > 1_000_000  # plotly.js itself is in the file
    assert f"<dd>{parent.info.run_id}</dd>" in text
    assert report_artifacts(root, parent.info.run_id) == ["report/sweep_report.html"]

    # By a trial's run id, to another file: the parent run still holds one report.
    other = tmp_path / "elsewhere" / "again.html"
    again = run_paiexp(root, "report", children[0].info.run_id, "-o", str(other))
    assert again.returncode == 0, again.stderr
    assert f"<h2>{PLOTS[0]}</h2>" in other.read_text()
    assert f"logged to MLflow run {parent.info.run_id}" in again.stdout
    assert report_artifacts(root, parent.info.run_id) == ["report/sweep_report.html"]
    logged = mlflow_client(root).download_artifacts(
        parent.info.run_id, "report/sweep_report.html", str(tmp_path)
    )
    assert Path(logged).read_text().count("Plotly.newPlot(") == len(PLOTS)
    assert len(sweep_runs(root)[1]) == len(children)  # a report adds no run


def test_report_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    root = xgb_project(tmp_path)
    unknown = assert_one_line_error(run_paiexp(root, "report", "nosuch"))
    assert (
        f"'nosuch' is neither a sweep (available: {SHIPPED_SWEEPS}) nor an MLflow run id"
    ) in unknown
    not_run = assert_one_line_error(run_paiexp(root, "report", "xgb"))
    assert "no study journal at" in not_run and "run the sweep first" in not_run
    assert_nothing_started(root)
    no_run = assert_one_line_error(run_paiexp(root, "report", "0" * 32))
    assert f"no MLflow run {'0' * 32!r}" in no_run


def test_plots_import_optuna_importance_without_scikit_learn() -> None:
    """PED-ANOVA needs no scikit-learn: the plots' imports leave it out (a CPU-second), and
    it imports as usual afterwards, on any thread."""
    script = "\n".join(
        [
            "import sys, threading",
            "from paiexp.sweep.study_artifacts import import_importance",
            "import_importance()",
            "import optuna.visualization.matplotlib",
            "assert 'optuna.importance' in sys.modules",
            "assert 'sklearn' not in sys.modules, 'scikit-learn was imported'",
            "from optuna.importance import PedAnovaImportanceEvaluator",
            "t = threading.Thread(target=lambda: __import__('sklearn.ensemble'))",
            "t.start(); t.join()",
            "import sklearn.ensemble",
            "assert not any('NoScikitLearn' in type(f).__name__ for f in sys.meta_path)",
        ]
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
