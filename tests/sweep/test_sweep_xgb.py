"""The main job: `python -m paiexp +sweep=xgb` from a fresh copy, continued and extended."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO, run_paiexp
from sweep_helpers import load_study, sweep_runs

pytestmark = pytest.mark.slow


def study_files(root: Path, run_id: str) -> dict[str, int | None]:
    """The parent run's study artifacts: the trials table's rows, and each plot (a PNG)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    files: dict[str, int | None] = {}
    for directory in ("study", "plots"):
        for artifact in client.list_artifacts(run_id, directory):
            local = Path(client.download_artifacts(run_id, artifact.path, str(root / "dl")))
            if local.suffix == ".csv":
                files[artifact.path] = len(local.read_text().splitlines()) - 1
            else:
                assert local.read_bytes().startswith(b"\x89PNG"), artifact.path
                files[artifact.path] = None
    return files


def test_xgb_sweep_runs_continues_and_extends(tmp_path: Path) -> None:
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, tmp_path / name)

    first = run_paiexp(tmp_path, "+sweep=xgb", "sweep.n_trials=6")
    assert first.returncode == 0, first.stderr
    # written ahead while it ran, the store is left in its rollback journal, whole by itself
    assert (tmp_path / "mlflow.db").read_bytes()[18:20] == b"\x01\x01"
    assert not list(tmp_path.glob("mlflow.db-*"))
    study = load_study(tmp_path, "xgb")
    assert len(study.trials) == 6
    assert all(t.state.is_finished() for t in study.trials)
    parents, children = sweep_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 6
    (parent,) = parents
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["best_test-auc"] == study.best_value
    assert parent.data.tags["paiexp.best_trial"] == str(study.best_trial.number)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    best_runs = [c for c in children if c.data.tags.get("paiexp.best") == "true"]
    assert [r.data.tags["paiexp.trial_number"] for r in best_runs] == [str(study.best_trial.number)]
    for child in children:
        state = child.data.tags["paiexp.trial_state"]
        assert child.info.status == {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}[state]
        assert "max_depth" in child.data.params and "paiexp.model_uri" in child.data.tags
    assert "top trials" in first.stderr and "mlflow ui --backend-store-uri" in first.stderr
    assert "optuna-dashboard" not in first.stderr  # not installed: not suggested
    assert study_files(tmp_path, parent.info.run_id) == {
        "study/trials.csv": 6,
        "plots/optimization_history.png": None,
        "plots/param_importances.png": None,
    }

    again = run_paiexp(tmp_path, "+sweep=xgb", "sweep.n_trials=6")
    assert again.returncode == 0, again.stderr
    assert len(load_study(tmp_path, "xgb").trials) == 6
    assert len(sweep_runs(tmp_path)[1]) == 6

    more = run_paiexp(tmp_path, "+sweep=xgb", "sweep.n_trials=8")
    assert more.returncode == 0, more.stderr
    study = load_study(tmp_path, "xgb")
    assert len(study.trials) == 8
    parents, children = sweep_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 8
    assert parents[0].data.metrics["best_test-auc"] == study.best_value
    assert study_files(tmp_path, parents[0].info.run_id)["study/trials.csv"] == 8  # drawn again
    # A resumed, seeded sampler proposes new points rather than replaying the first ones.
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 8
