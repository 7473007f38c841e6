"""Each finished trial's model as an MLflow logged model, the best one registered (the alias
``best`` moving only on improvement), and each run's input channels as its dataset inputs."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import assert_one_line_error, mlflow_client, run_paiexp
from emulator import Emulator
from servers import free_port
from sweep_helpers import synthetic_project

from paiexp.config.record import RunRecord
from paiexp.config.spec import JobSpec
from paiexp.tracking.mlflow_tracker import MlflowTracker

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

JOB = {  # the synthetic job, writing a model file
    "command": "python job.py && echo model > $PAI_OUTPUT_MODEL/model.txt",
    "hyperparameters": {"x": 0.0, "duration": 0.2, "steps": 2},
    "inputs": {"train": "data/train.csv", "extra": "data/extra"},
}


def sweep(root: Path, study: str, xs: list[float]) -> str:
    """Run a sweep of these points registering in syn-model; the summary's registered line
    (the summary is on stderr)."""
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
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("registered:")]
    return line


def project(tmp_path: Path, **sweep: Any) -> Path:
    root = synthetic_project(
        tmp_path, {"params": {"x": "interval(0, 1)"}, "sampler": {"name": "random"}, **sweep}, JOB
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
    assert sweep(root, "first", [0.5, 0.2, 0.9]) == "registered:    syn-model version 1 (best)"
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
    line = sweep(root, "second", [0.6, 0.7])
    assert line == "registered:    syn-model version 2 (best stays version 1)"
    versions = client.search_model_versions("name = 'syn-model'")
    assert len(versions) == 2
    assert client.get_model_version_by_alias("syn-model", "best").version == best.version
    # A better one takes it.
    assert sweep(root, "third", [0.1]) == "registered:    syn-model version 3 (best)"
    better = client.get_model_version_by_alias("syn-model", "best")
    assert better.run_id == trial_runs(client, "third")["0.1"].info.run_id
    assert float(better.tags["paiexp.objective_value"]) == pytest.approx(0.01)

    # paiexp register: a trial's run by id, with what its parent run says of the objective;
    # registering a model twice gives the version it has.
    worse = runs["0.5"].info.run_id
    done = run_paiexp(root, "register", worse, "syn-model")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"syn-model version 4; best stays version {better.version}"
    version = client.get_model_version("syn-model", "4")
    assert (version.run_id, version.tags["paiexp.objective_value"]) == (worse, "0.25")
    assert version.tags["paiexp.objective"] == "score"
    done = run_paiexp(root, "register", better.run_id, "syn-model")
    assert done.stdout.strip() == f"syn-model version {better.version} (best)"

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


def test_a_single_runs_model_is_logged_and_registered_by_run_id(tmp_path: Path) -> None:
    root = project(tmp_path)
    done = run_paiexp(root, "job.hyperparameters.x=0.3")
    assert done.returncode == 0, done.stdout + done.stderr
    client = mlflow_client(root)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (model,) = client.search_logged_models([run.info.experiment_id])
    assert model.source_run_id == run.info.run_id
    assert {m.key: m.value for m in model.metrics}["score"] == pytest.approx(0.09)
    assert {d.dataset.name for d in run.inputs.dataset_inputs} == {"train", "extra"}

    done = run_paiexp(root, "register", run.info.run_id, "single")
    assert (done.returncode, done.stdout.strip()) == (0, "single version 1 (best)"), done.stderr
    best = client.get_model_version_by_alias("single", "best")
    assert (best.run_id, best.source) == (run.info.run_id, model.tags["paiexp.model_uri"])
    assert "paiexp.objective_value" not in best.tags  # a single run has no objective

    line = assert_one_line_error(run_paiexp(root, "register", "0" * 32, "single"))
    assert "run_id: no MLflow run '" + "0" * 32 in line

    # A job that leaves its model channel empty made no model: no logged model, none to register.
    done = run_paiexp(root, "job.command=python job.py")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = client.search_runs([run.info.experiment_id])
    (empty,) = [r for r in runs if r.info.run_id != run.info.run_id]
    assert len(client.search_logged_models([run.info.experiment_id])) == 1
    line = assert_one_line_error(run_paiexp(root, "register", empty.info.run_id, "single"))
    assert "is no finished run with a model to register" in line


def test_register_of_a_multi_objective_sweep_is_a_one_line_error(tmp_path: Path) -> None:
    objectives = [{"metric": "score", "direction": "minimize"}, {"metric": "loss"}]
    root = project(tmp_path, objective=objectives)
    done = run_paiexp(root, "+sweep=syn", "sweep.register=syn-model")
    assert assert_one_line_error(done).startswith("paiexp: error: sweep.register: a multi-obj")
    assert not (root / "mlflow.db").exists()


def test_oss_inputs_are_datasets_with_their_etags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object's ETag, a prefix's hash of its objects' ETags, on the backend's endpoint;
    an input that cannot be read (no such object, no OSS answering) is "unknown", and the
    run is tracked all the same, at once."""
    data = tmp_path / "local.csv"
    data.write_text("1\n")
    with Emulator(tmp_path / "cloud") as cloud:
        cloud.store.put(cloud.bucket, "data/train.csv", b"a,b\n1,2\n")
        cloud.store.put(cloud.bucket, "data/parts/p0", b"x")
        cloud.store.put(cloud.bucket, "data/parts/p1", b"y")
        monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", cloud.credentials.access_key_id)
        monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", cloud.credentials.access_key_secret)
        inputs = {
            "train": f"oss://{cloud.bucket}/data/train.csv",
            "parts": f"oss://{cloud.bucket}/data/parts",
            "gone": f"oss://{cloud.bucket}/data/nothing",
            "local": str(data),
        }
        backend = {"region": cloud.region, "oss": {"endpoint": cloud.oss_endpoint}}
        record = RunRecord(
            spec=JobSpec(name="j", command="true", inputs=inputs),
            config_yaml=yaml.safe_dump({"backend": backend}),
            backend="pai",
            project_dir=str(tmp_path),
        )
        tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
        run_id = tracker.create_run(record)
        tracker.log_record(run_id, record)
        head = cloud.store.head(cloud.bucket, "data/train.csv")
        assert head is not None
        etag = head.etag
        nowhere = {"region": cloud.region, "oss": {"endpoint": f"http://127.0.0.1:{free_port()}"}}
        unread = dataclasses.replace(record, config_yaml=yaml.safe_dump({"backend": nowhere}))
        no_oss = tracker.create_run(unread)
        started = time.monotonic()
        tracker.log_record(no_oss, unread)
        assert time.monotonic() - started < 10

    client = mlflow_client(tmp_path)
    found = {d.dataset.name: d.dataset for d in client.get_run(run_id).inputs.dataset_inputs}
    assert found["train"].digest == etag.strip('"')
    assert (found["train"].source_type, found["train"].source) == ("oss", inputs["train"])
    assert len(found["parts"].digest) == 16
    assert found["gone"].digest == "unknown"
    assert found["local"].digest == hashlib.sha256(b"1\n").hexdigest()[:16]
    blind = client.get_run(no_oss).inputs.dataset_inputs
    assert {d.dataset.name: d.dataset.digest for d in blind} == {
        "train": "unknown",
        "parts": "unknown",
        "gone": "unknown",
        "local": found["local"].digest,
    }
