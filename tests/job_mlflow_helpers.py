"""A training script that reports only through MLflow's own calls (``mlflow.xgboost.autolog``,
``log_param``, ``log_metric``, ``set_tag``), and what its job's run must then hold.

The script logs its params, a tag, XGBoost's autologged params, curve, datasets and model and
three points of ``own_metric``; then, with ``$GATE`` set, it waits for the file
``$GATE-<max_depth>`` (``held`` in its log); then three more points.  It trains with eta 0.3
while paiexp's hyperparameter says 0.5: autolog's ``eta`` clashes with paiexp's param (one
warning line, paiexp's value kept).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SCRIPT = """\
import os
import time

import mlflow
import numpy as np
import xgboost as xgb

mlflow.xgboost.autolog()
rng = np.random.default_rng(0)
features = rng.random((300, 4))
labels = (features[:, 0] + features[:, 1] > 1).astype(int)
train = xgb.DMatrix(features[:200], label=labels[:200])
valid = xgb.DMatrix(features[200:], label=labels[200:])
depth = int(os.environ["PAI_HPS_MAX_DEPTH"])
with mlflow.start_run():
    mlflow.log_param("own_param", f"depth-{depth}")
    mlflow.set_tag("own_tag", f"tag-{depth}")
    params = {"max_depth": depth, "eta": 0.3, "objective": "binary:logistic"}
    xgb.train({**params, "eval_metric": "logloss"}, train, 4, evals=[(valid, "valid")])
    for step in range(3):
        mlflow.log_metric("own_metric", depth + step / 10, step=step)
    if os.environ.get("GATE"):
        print("held", flush=True)
        while not os.path.exists(f"{os.environ['GATE']}-{depth}"):
            time.sleep(0.05)
    for step in range(3, 6):
        mlflow.log_metric("own_metric", depth + step / 10, step=step)
print(f"score={depth / 10}")
"""
JOB = "own"  # conf/job/own.yaml
CLASH = "its own MLflow param 'eta' logged as '0.3', the run keeps '0.5'"


def write_project(project: Path) -> None:
    """The script in ``own/`` and its job, ``job=own``."""
    (project / "own").mkdir()
    (project / "own" / "train.py").write_text(SCRIPT)
    job = {
        "name": JOB,
        "command": "python train.py",
        "source_dir": "own",
        "hyperparameters": {"max_depth": 3, "eta": 0.5},
        "metric_definitions": [{"name": "score", "regex": r"score=([0-9.]+)"}],
        "mlflow_metrics": ["own_metric"],  # declared: read as the job runs
    }
    (project / "conf" / "job" / f"{JOB}.yaml").write_text(yaml.safe_dump(job))


def check_run(client: Any, run: Any, depth: int) -> None:
    """Run ``run`` holds what its job's script logged with MLflow (for ``max_depth`` =
    ``depth``), each point once, paiexp's own params and tags as paiexp set them."""
    from mlflow.entities import LoggedModelStatus

    run_id = run.info.run_id
    params, tags = run.data.params, run.data.tags
    assert params["own_param"] == f"depth-{depth}"
    assert params["num_boost_round"] == "4"  # autolog's
    assert (params["max_depth"], params["eta"]) == (str(depth), "0.5")  # paiexp's
    assert tags["own_tag"] == f"tag-{depth}"
    assert tags["mlflow.runName"] == run.info.run_name  # paiexp's name, not the script's
    assert tags["paiexp.job_name"] and tags["paiexp.status"] == "SUCCEEDED"
    assert "mlflow.source.type" not in tags  # the script's run's, not merged
    assert run.data.metrics["score"] == depth / 10  # paiexp's, from the log
    own = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "own_metric"))
    assert own == [(step, depth + step / 10) for step in range(6)]
    assert [m.step for m in client.get_metric_history(run_id, "valid-logloss")] == [0, 1, 2, 3]
    assert {d.dataset.name for d in run.inputs.dataset_inputs} >= {"valid"}
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"feature_importance_weight.json", "config", "job", "logs"} <= artifacts
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
    )
    (model,) = [m for m in models if "paiexp.job_model_id" in m.tags]
    assert model.status == LoggedModelStatus.READY
    assert model.model_id in {output.model_id for output in run.outputs.model_outputs}


def load_model(client: Any, run: Any) -> Any:
    """The XGBoost model the script autologged, loaded from the run's logged model."""
    import mlflow.xgboost

    (model,) = [
        m
        for m in client.search_logged_models(
            [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
        )
        if "paiexp.job_model_id" in m.tags
    ]
    return mlflow.xgboost.load_model(model.artifact_location)


def no_stray_store(working_dirs: list[Path]) -> None:
    """No job made an MLflow store in its working directory (MLflow's default there)."""
    assert working_dirs
    for directory in working_dirs:
        assert not (directory / "mlflow.db").exists(), directory
        assert not (directory / "mlruns").exists(), directory
