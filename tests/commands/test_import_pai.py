"""`paiexp import pai`: PAI training jobs created elsewhere (here through the official client,
as the PAI console or SDK would) become MLflow runs, each once."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from alibabacloud_paistudio20220112 import models as pai
from alibabacloud_paistudio20220112.client import Client as PaiClient
from alibabacloud_tea_openapi import models as open_api_models
from conftest import REPO, all_runs, assert_one_line_error, mlflow_client, run_paiexp, wait_until
from emulator import Emulator
from test_pai_backend import pai_env, pai_overrides

pytestmark = pytest.mark.slow

TRAIN_PY = """\
import json, os
hps = json.loads(os.environ["PAI_HPS"])
lr = float(hps["learning_rate"])
for epoch in range(int(hps["epochs"])):
    print(f"epoch={epoch} loss={lr / (epoch + 1):.4f}", flush=True)
with open(os.path.join(os.environ["PAI_OUTPUT_MODEL"], "model.json"), "w") as handle:
    json.dump({"lr": lr}, handle)
raise SystemExit(int(hps.get("exit_code", "0")))
"""


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "cloud") as emulator:  # jobs as host processes: fast
        yield emulator


def console_job(
    client: PaiClient, cloud: Emulator, name: str, team: str, hyperparameters: dict[str, str]
) -> str:
    """A training job made the way the PAI console makes one: code on OSS, a metric regex."""
    prefix = f"console/{name}/code/"
    cloud.store.put(cloud.bucket, prefix + "train.py", TRAIN_PY.encode())
    request = pai.CreateTrainingJobRequest(
        training_job_name=name,
        workspace_id=cloud.workspace_id,
        algorithm_spec=pai.AlgorithmSpec(
            image=cloud.default_image,
            command=["/bin/sh", "-c", "python train.py"],
            job_type="XGBoostJob",
            code_dir=pai.Location(
                location_type="oss", location_value={"Bucket": cloud.bucket, "Key": prefix}
            ),
            metric_definitions=[pai.MetricDefinition(name="loss", regex=r"loss=([0-9.]+)")],
        ),
        compute_resource=pai.CreateTrainingJobRequestComputeResource(
            ecs_spec="ecs.c6.large", ecs_count=1
        ),
        hyper_parameters=[
            pai.CreateTrainingJobRequestHyperParameters(name=k, value=v)
            for k, v in hyperparameters.items()
        ],
        output_channels=[
            pai.CreateTrainingJobRequestOutputChannels(
                name="model", output_uri=f"oss://{cloud.bucket}/console/{name}/model/"
            )
        ],
        labels=[pai.CreateTrainingJobRequestLabels(key="team", value=team)],
    )
    return str(client.create_training_job(request).body.training_job_id)


def test_imported_jobs_become_runs_once(cloud: Emulator, tmp_path: Path) -> None:
    creds = cloud.credentials
    client = PaiClient(
        open_api_models.Config(
            access_key_id=creds.access_key_id,
            access_key_secret=creds.access_key_secret,
            endpoint=cloud.pai_endpoint,
            protocol="http",
            region_id=cloud.region,
        )
    )
    rates = {"vision-a": "0.5", "vision-b": "0.2", "vision-c": "0.1"}
    ids = {
        name: console_job(client, cloud, name, "vision", {"learning_rate": lr, "epochs": "3"})
        for name, lr in rates.items()
    }
    failing = console_job(
        client, cloud, "nlp-a", "nlp", {"learning_rate": "0.3", "epochs": "2", "exit_code": "3"}
    )
    for job_id in [*ids.values(), failing]:
        wait_until(
            lambda j=job_id: client.get_training_job(j).body.status in ("Succeed", "Failed"),
            60,
            f"job {job_id} ending",
        )
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    root, env, options = tmp_path, pai_env(cloud), pai_overrides(cloud)

    first = run_paiexp(root, "import", "pai", "--label", "team=vision", *options, env=env)
    assert first.returncode == 0, first.stderr
    assert "3 imported" in first.stdout
    runs = {r.data.tags["paiexp.job_id"]: r for r in all_runs(root)}
    assert set(runs) == set(ids.values())
    client_ml = mlflow_client(root)
    for name, job_id in ids.items():
        run, job = runs[job_id], cloud.job(job_id)
        lr = float(rates[name])
        assert run.info.run_name == name and run.info.status == "FINISHED"
        assert run.data.params["learning_rate"] == rates[name]
        assert run.data.params["epochs"] == "3"
        assert run.data.params["job.instance_type"] == "ecs.c6.large"
        assert run.data.params["job.command"] == "python train.py"
        model = f"oss://{cloud.bucket}/console/{name}/model/"
        assert run.data.tags["paiexp.model_uri"] == model == run.data.params["paiexp.model_uri"]
        assert cloud.store.get(cloud.bucket, f"console/{name}/model/model.json")  # it is there
        assert run.data.tags["paiexp.console_url"] == job["TrainingJobUrl"]
        assert run.data.tags["paiexp.status"] == "SUCCEEDED"
        assert run.data.tags["paiexp.pai_status"] == "Succeed"
        assert run.data.tags["paiexp.duration_seconds"] == str(job["Duration"])
        assert run.data.tags["paiexp.label.team"] == "vision"
        assert run.info.end_time >= run.info.start_time
        history = client_ml.get_metric_history(run.info.run_id, "loss")
        expected = [round(lr / (epoch + 1), 4) for epoch in range(3)]
        assert [(m.step, m.value) for m in history] == list(enumerate(expected))
        assert run.data.metrics["loss"] == expected[-1]

    again = run_paiexp(root, "import", "pai", *ids.values(), *options, env=env)
    assert again.returncode == 0, again.stderr
    assert "3 already imported" in again.stdout and "imported as run" not in again.stdout
    assert len(all_runs(root)) == 3

    since = run_paiexp(root, "import", "pai", "--since", "2000-01-01", *options, env=env)
    assert since.returncode == 0, since.stderr
    assert "1 imported, 3 already imported" in since.stdout
    (failed,) = [r for r in all_runs(root) if r.data.tags["paiexp.job_id"] == failing]
    assert failed.info.status == "FAILED"
    assert "JobFailed" in failed.data.tags["paiexp.failure_reason"]
    assert len(all_runs(root)) == 4

    nothing = run_paiexp(root, "import", "pai", "--since", "2999-01-01", *options, env=env)
    assert nothing.returncode == 0 and "no jobs selected" in nothing.stdout


def test_import_mistakes_are_one_line_errors(cloud: Emulator, tmp_path: Path) -> None:
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    env, options = pai_env(cloud), pai_overrides(cloud)
    none = assert_one_line_error(run_paiexp(tmp_path, "import", "pai", *options, env=env))
    assert "give JOB_ID..., --label KEY=VALUE or --since DATE" in none
    date = assert_one_line_error(
        run_paiexp(tmp_path, "import", "pai", "--since", "yesterday", *options, env=env)
    )
    assert "--since: 'yesterday' is not a date" in date
    label = assert_one_line_error(
        run_paiexp(tmp_path, "import", "pai", "--label", "team", *options, env=env)
    )
    assert "--label: expected KEY=VALUE, got 'team'" in label
    unknown = assert_one_line_error(
        run_paiexp(tmp_path, "import", "pai", "trainnosuchjob", *options, env=env)
    )
    assert "TRAINING_JOB_NOT_FOUND" in unknown
    assert not (tmp_path / "mlflow.db").exists()  # nothing tracked before every job was found
