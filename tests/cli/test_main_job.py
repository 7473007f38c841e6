"""`python -m paiexp`: the XGBoost example trained on the local backend and tracked in MLflow."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import all_runs, mlflow_client, run_paiexp

pytestmark = pytest.mark.slow


def test_main_job_trains_xgboost_and_tracks_it(project: Path) -> None:
    result = run_paiexp(project)
    assert result.returncode == 0, result.stderr
    assert "test-auc=" in result.stdout  # the job's log is echoed
    (run,) = all_runs(project)
    client = mlflow_client(project)
    assert run.info.status == "FINISHED"

    params = run.data.params
    assert len(params) >= 5
    assert params["max_depth"] == "6" and params["learning_rate"] == "0.1"
    assert params["job.backend"] == "local"
    assert params["job.command"] == "python train.py $PAI_USER_ARGS"

    history = client.get_metric_history(run.info.run_id, "validation-logloss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(100))
    assert 0.9 < run.data.metrics["test-auc"] <= 1.0

    tags = run.data.tags
    model_dir = Path(urlparse(tags["paiexp.model_uri"]).path)
    assert (model_dir / "model.json").stat().st_size > 1000
    assert tags["paiexp.status"] == "SUCCEEDED"
    assert tags["paiexp.job_name"].startswith("xgb-breast-cancer-")
    assert tags["paiexp.job_id"] == tags["paiexp.job_name"]
    assert len(tags["paiexp.config_hash"]) == 64
    assert len(tags["paiexp.source_digest"]) == 64

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "config")}
    artifacts |= {a.path for a in client.list_artifacts(run.info.run_id, "job")}
    artifacts |= {a.path for a in client.list_artifacts(run.info.run_id, "logs")}
    assert {
        "config/resolved.yaml",
        "job/spec.json",
        "job/hyperparameters.json",
        f"logs/{tags['paiexp.job_name']}.log",
    } <= artifacts


def test_override_changes_the_param_and_the_run(project: Path) -> None:
    result = run_paiexp(
        project, "-q", "job.hyperparameters.max_depth=3", "job.hyperparameters.n_estimators=7"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # -q: the job's log is not echoed
    (run,) = all_runs(project)
    assert run.data.params["max_depth"] == "3"
    history = mlflow_client(project).get_metric_history(run.info.run_id, "validation-logloss")
    assert len(history) == 7


def test_failed_job_gives_a_failed_run_with_reason_and_log_tail(project: Path) -> None:
    result = run_paiexp(project, "-q", "job.command='echo boom >&2; exit 3'")
    assert result.returncode == 1
    assert "FAILED" in result.stderr and "exited with code 3" in result.stderr
    (run,) = all_runs(project)
    assert run.info.status == "FAILED"
    assert run.data.tags["paiexp.failure_reason"] == "command exited with code 3"
    assert run.data.tags["paiexp.log_tail"].endswith("boom")
