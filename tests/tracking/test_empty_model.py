"""A job that succeeded without writing its model is never a silent, empty model URI."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml
from conftest import all_runs, mlflow_client, run_paiexp
from pipeline_helpers import starter_project

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

WARNING = "succeeded but left its model channel empty"


def write_job(project: Path, command: str) -> None:
    job = {"name": "nomodel", "command": command, "metric_definitions": []}
    (project / "conf" / "job" / "nomodel.yaml").write_text(yaml.safe_dump(job))


@pytest.mark.parametrize("backend", ["local", pytest.param("pai", marks=pytest.mark.slow)])
def test_an_empty_model_channel_is_warned_and_tagged(
    project: Path, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """On PAI too, where its MLflow store (which holds no model) is looked at on OSS."""
    write_job(project, "echo trained; mkdir -p $PAI_OUTPUT_MODEL/empty-subdir")
    with contextlib.ExitStack() as stack:
        overrides: list[str] = []
        env = None
        if backend == "pai":
            from emulator import Emulator
            from test_pai_backend import pai_env, pai_overrides

            cloud = stack.enter_context(Emulator(tmp_path_factory.mktemp("cloud")))
            overrides, env = pai_overrides(cloud), pai_env(cloud)
        result = run_paiexp(project, "job=nomodel", "-q", *overrides, env=env)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if WARNING in line]
    assert len(warnings) == 1, result.stderr
    assert "/ml/output/model" in warnings[0]
    (run,) = all_runs(project)
    assert WARNING in run.data.tags["paiexp.warning"]
    assert run.data.tags["paiexp.model_uri"]  # still recorded: where the model should be


def test_a_written_model_gets_no_warning(project: Path) -> None:
    write_job(project, "echo weights > $PAI_OUTPUT_MODEL/model.bin")
    result = run_paiexp(project, "job=nomodel", "-q")
    assert result.returncode == 0, result.stderr
    assert WARNING not in result.stderr
    (run,) = all_runs(project)
    assert "paiexp.warning" not in run.data.tags


def test_a_model_the_jobs_own_mlflow_calls_logged_gets_no_warning(tmp_path: Path) -> None:
    """The starter's MLflow-only script (examples/xgb_autolog) writes nothing to its model
    channel: autolog's model, merged into its run, is its model."""
    root = starter_project(tmp_path)
    result = run_paiexp(root, "job=xgb_autolog")
    assert result.returncode == 0, result.stderr
    assert WARNING not in result.stderr and "  model: " not in result.stderr, result.stderr
    (run,) = all_runs(root)
    assert "paiexp.warning" not in run.data.tags
    assert run.data.params["num_boost_round"] == "50"  # autolog's
    assert 0.9 < run.data.metrics["test_auc"] <= 1.0  # its log_metric call
    client = mlflow_client(root)
    curve = client.get_metric_history(run.info.run_id, "test-auc")  # autolog's, per round
    assert sorted(m.step for m in curve) == list(range(50))
    models = client.search_logged_models([run.info.experiment_id])
    assert [m.source_run_id for m in models if "paiexp.job_model_id" in m.tags] == [run.info.run_id]
