"""Each finished trial's model as an MLflow logged model, the best one registered (the alias
``best`` moving only on improvement), and each run's input channels as its dataset inputs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from conftest import mlflow_client, run_paiexp
from sweep_helpers import synthetic_project

JOB = {
    "hyperparameters": {"x": 0.0, "duration": 0.2, "steps": 2},
    "inputs": {"train": "data/train.csv", "extra": "data/extra"},
}


def sweep(root: Path, study: str, xs: list[float]) -> None:
    enqueue = ",".join(f"{{x: {x}}}" for x in xs)
    done = run_paiexp(
        root,
        "+sweep=syn",
        f"sweep.study_name={study}",
        f"sweep.n_trials={len(xs)}",
        f"+sweep.enqueue=[{enqueue}]",
        "sweep.register=syn-model",
    )
    assert done.returncode == 0, done.stdout + done.stderr


def project(tmp_path: Path) -> Path:
    root = synthetic_project(
        tmp_path, {"params": {"x": "interval(0, 1)"}, "sampler": {"name": "random"}}, JOB
    )
    (root / "data" / "extra").mkdir(parents=True)
    (root / "data" / "train.csv").write_text("a,b\n1,2\n")
    (root / "data" / "extra" / "part-0").write_text("x\n")
    return root


def trial_runs(client: Any, study: str) -> dict[str, Any]:
    """The trial runs of a study's sweep by their x."""
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        f"tags.`paiexp.study_name` = '{study}'",
    )
    parent = next(r for r in runs if r.data.tags.get("paiexp.kind") == "sweep")
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    return {c.data.params["x"]: c for c in children}


@pytest.mark.timeout(240)
def test_trials_models_are_logged_models_and_the_best_one_is_registered(tmp_path: Path) -> None:
    root = project(tmp_path)
    sweep(root, "first", [0.5, 0.2, 0.9])
    client = mlflow_client(root)
    runs = trial_runs(client, "first")
    experiment_id = next(iter(runs.values())).info.experiment_id

    models = client.search_logged_models([experiment_id])
    assert len(models) == 3
    by_run = {m.source_run_id: m for m in models}
    assert set(by_run) == {r.info.run_id for r in runs.values()}
    for x, run in runs.items():
        model = by_run[run.info.run_id]
        assert model.status == "READY"
        assert model.tags["paiexp.model_uri"] == run.data.tags["paiexp.model_uri"]
        assert model.tags["paiexp.model_uri"].startswith("file://")
        assert model.params["x"] == x
        metrics = {m.key: m.value for m in model.metrics}
        assert metrics["score"] == pytest.approx(float(x) ** 2)
        assert "loss" in metrics
        assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]
        # The metric's history is the job's own: logging it with the model added no step.
        assert len(client.get_metric_history(run.info.run_id, "loss")) == 2
    # The Models tab sorts by a metric.
    ranked = client.search_logged_models(
        [experiment_id], order_by=[{"field_name": "metrics.score", "ascending": True}]
    )
    assert [m.params["x"] for m in ranked] == ["0.2", "0.5", "0.9"]

    best = client.get_model_version_by_alias("syn-model", "best")
    assert best.run_id == runs["0.2"].info.run_id
    assert best.source == runs["0.2"].data.tags["paiexp.model_uri"]
    assert best.tags["paiexp.model_id"] == by_run[runs["0.2"].info.run_id].model_id
    assert best.tags["paiexp.study"] == "first"
    assert best.tags["paiexp.trial"] == "1"
    assert float(best.tags["paiexp.objective_value"]) == pytest.approx(0.04)
    assert best.tags["paiexp.direction"] == "minimize"

    # A worse follow-up sweep registers its best as a version; best stays where it was.
    sweep(root, "second", [0.6, 0.7])
    versions = client.search_model_versions("name = 'syn-model'")
    assert len(versions) == 2
    assert client.get_model_version_by_alias("syn-model", "best").version == best.version
    # A better one takes it.
    sweep(root, "third", [0.1])
    better = client.get_model_version_by_alias("syn-model", "best")
    assert better.run_id == trial_runs(client, "third")["0.1"].info.run_id
    assert float(better.tags["paiexp.objective_value"]) == pytest.approx(0.01)

    # Each run's inputs: its channels, with the content hashes of the file and directory.
    train = hashlib.sha256((root / "data" / "train.csv").read_bytes()).hexdigest()
    for run in runs.values():
        inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
        assert set(inputs) == {"train", "extra"}
        assert inputs["train"].digest == train[:16]
        assert inputs["train"].source_type == "local"
        assert inputs["train"].source == (root / "data" / "train.csv").resolve().as_uri()
        assert len(inputs["extra"].digest) == 16
    assert len({d.dataset.digest for r in runs.values() for d in r.inputs.dataset_inputs}) == 2
