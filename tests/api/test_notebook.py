"""The example notebook runs top to bottom in a real Jupyter kernel (nbclient, ipykernel),
as a user runs it: a sweep launched without blocking, its trials read while it runs, the
best model loaded with XGBoost and scored."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from conftest import mlflow_client
from nbclient import NotebookClient
from pipeline_helpers import starter_project
from sweep_helpers import load_study

from paiexp.tracking.mlflow_tracker import STUDY_NAME_TAG

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

N_TRIALS = 8


def text_of(cell: nbformat.NotebookNode) -> str:
    """What a cell showed: its printed text and its result's plain text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output["text"])
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
        elif output.get("output_type") == "error":
            parts.append("\n".join(output["traceback"]))
    return "\n".join(parts)


@pytest.mark.timeout(600)
def test_the_example_notebook_runs_top_to_bottom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = starter_project(tmp_path)
    here = root / "examples" / "notebooks"
    notebook = nbformat.read(here / "xgb_sweep.ipynb", as_version=4)
    for name in [n for n in __import__("os").environ if n.startswith("MLFLOW_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PAIEXP_PROJECT", str(root))
    client = NotebookClient(
        notebook, timeout=540, kernel_name="python3", resources={"metadata": {"path": str(here)}}
    )
    client.execute()
    shown = [text_of(cell) for cell in notebook.cells if cell.cell_type == "code"]

    assert shown[0].strip() == "'xgb'"
    counted = re.search(r"(\d+) trials: (\{.*\})", shown[3])
    assert counted, shown[3]
    # the compact progress: one output, replaced in place, last showing the sweep done
    status = re.search(rf"^sweep {N_TRIALS}/{N_TRIALS} done \((\d+) complete.*$", shown[3], re.M)
    assert status, shown[3]
    assert shown[3].count("sweep ") == 1
    study = load_study(root, "xgb")
    assert int(counted.group(1)) == len(study.trials) == N_TRIALS

    best = re.search(r"best trial (\d+): test-auc ([0-9.]+)", shown[4])
    assert best, shown[4]
    assert int(best.group(1)) == study.best_trial.number
    value = float(best.group(2))
    (parent,) = [
        r
        for r in mlflow_client(root).search_runs(["1"])
        if r.data.tags.get("paiexp.kind") == "sweep" and r.data.tags[STUDY_NAME_TAG] == "xgb"
    ]
    assert value == study.best_value == parent.data.metrics["best_test-auc"]

    scored = re.search(r"test AUC of the best model: ([0-9.]+)", shown[5])
    assert scored, shown[5]
    assert float(scored.group(1)) == pytest.approx(value, abs=1e-6)  # the trial's own metric

    # the sweep defined in the notebook: a job and a space, no sweeps/ file
    defined = re.search(r"xgb-defined: best test-auc ([0-9.]+) with (\{.*\})", shown[6])
    assert defined, shown[6]
    study = load_study(root, "xgb-defined")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert float(defined.group(1)) == study.best_value
    assert defined.group(2) == str(study.best_trial.params)
    assert not (root / "sweeps" / "xgb-defined.yaml").exists()
