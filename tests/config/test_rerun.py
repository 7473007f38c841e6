"""Reproducibility: the config stored with a run rebuilds the same job; secrets stay out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import all_runs, clean_env, mlflow_client, run_paiexp

from paiexp.config.spec import JobSpec
from paiexp.runs import prepare_from_record
from paiexp.tracking.mlflow_tracker import CONFIG_ARTIFACT

pytestmark = pytest.mark.slow
SECRET = "s3cr3t-Value-never-logged"


def test_rerun_rebuilds_the_same_spec_and_runs_it(project: Path) -> None:
    env = clean_env(MY_API_TOKEN=SECRET)
    first = run_paiexp(
        project,
        "-q",
        "job.hyperparameters.n_estimators=5",
        "+job.environments.MY_API_TOKEN=" + SECRET,
        "+job.environments.PLAIN=visible",
        env=env,
    )
    assert first.returncode == 0, first.stderr
    (run,) = all_runs(project)
    job_name = run.data.tags["paiexp.job_name"]
    submitted = JobSpec.from_dict(
        json.loads((project / ".paiexp" / "jobs" / job_name / "spec.json").read_text())
    )

    client = mlflow_client(project)
    stored = client.download_artifacts(run.info.run_id, CONFIG_ARTIFACT, str(project))
    config_yaml = Path(stored).read_text()
    assert SECRET not in config_yaml and "${oc.env:MY_API_TOKEN}" in config_yaml
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MY_API_TOKEN", SECRET)
        rebuilt = prepare_from_record(config_yaml, project, []).spec
    assert rebuilt.environments["MY_API_TOKEN"] == SECRET
    assert submitted.labels.pop("paiexp-run") == run.info.run_id  # the job knows its run
    assert dataclasses.replace(rebuilt, name=job_name) == dataclasses.replace(
        submitted, environments=rebuilt.environments
    )

    again = run_paiexp(project, "rerun", run.info.run_id, "-q", env=env)
    assert again.returncode == 0, again.stderr
    runs = {r.info.run_id: r for r in all_runs(project)}
    (new,) = [r for r in runs.values() if r.info.run_id != run.info.run_id]
    assert new.data.tags["paiexp.rerun_of"] == run.info.run_id
    outputs = ("paiexp.model_uri",)  # where each run's model went: its own directory
    assert {k: v for k, v in new.data.params.items() if k not in outputs} == {
        k: v for k, v in run.data.params.items() if k not in outputs
    }
    assert new.data.tags["paiexp.config_hash"] == run.data.tags["paiexp.config_hash"]
    assert new.data.metrics["test-auc"] == run.data.metrics["test-auc"]  # seeded: same model

    edited = run_paiexp(
        project, "rerun", run.info.run_id, "-q", "job.hyperparameters.max_depth=2", env=env
    )
    assert edited.returncode == 0, edited.stderr
    assert sorted(r.data.params["max_depth"] for r in all_runs(project)) == ["2", "6", "6"]

    # The secret reached the job (its environment) but nothing paiexp wrote.
    for path in project.rglob("*"):
        if path.is_file() and path.suffix not in {".csv"}:
            assert SECRET.encode() not in path.read_bytes(), path
    for output in (first, again, edited):
        assert SECRET not in output.stdout + output.stderr


def test_rerun_of_an_unknown_run_is_a_user_error(project: Path) -> None:
    run_paiexp(project, "-q", "job.command=true")
    result = run_paiexp(project, "rerun", "0123456789abcdef")
    assert result.returncode == 2
    assert result.stderr.startswith("paiexp: error: run_id: no MLflow run")
