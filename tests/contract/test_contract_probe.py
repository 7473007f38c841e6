"""A probe written only against the PAI contract sees exactly the expected values."""

from __future__ import annotations

import json
import shutil
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import pytest
import yaml
from cli_backends import CliBackend
from conftest import REPO, all_runs, run_paiexp

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

HYPERPARAMETERS = {
    "epochs": 10,
    "batch-size": 32,
    "train": {"learning_rate": 0.001},
    "note": 'it\'s a "quoted" value with spaces',
    "flag": True,
}
AS_STRINGS = {
    "epochs": "10",
    "batch-size": "32",
    "train.learning_rate": "0.001",
    "note": 'it\'s a "quoted" value with spaces',
    "flag": "true",
}
ML_TREE = [
    "code/",
    "code/probe.py",
    "input/",
    "input/config/",
    "input/config/hyperparameters.json",
    "input/data/",
    "input/data/shards/",
    "input/data/shards/part-0.csv",
    "input/data/shards/part-1.csv",
    "input/data/train/",
    "input/data/train/single.csv",
    "output/",
    "output/checkpoints/",
    "output/extra/",
    "output/model/",
    "output/output_parameters/",
    "output/paiexp_mlflow/",  # the job's own MLflow store's (paiexp.contract.job_mlflow)
    "output/tensorboard/",
    "usercode/",
    "usercode/probe.py",
]


def write_probe_project(project: Path) -> None:
    shutil.copytree(REPO / "tests" / "probe", project / "probe")
    (project / "data" / "dir").mkdir(parents=True)
    (project / "data" / "single.csv").write_text("a,b\n1,2\n")
    (project / "data" / "dir" / "part-0.csv").write_text("x\n")
    (project / "data" / "dir" / "part-1.csv").write_text("y\n")
    job = {
        "name": "probe",
        "command": "python probe.py $PAI_USER_ARGS",
        "source_dir": "probe",
        "hyperparameters": HYPERPARAMETERS,
        "inputs": {"train": "data/single.csv", "shards": "data/dir"},
        "outputs": {"extra": None},
        "environments": {"PROBE_CUSTOM": "custom value"},
        "metric_definitions": [{"name": "probe-ok", "regex": r"probe-ok=(\d+)"}],
    }
    (project / "conf" / "job" / "probe.yaml").write_text(yaml.safe_dump(job))


def test_probe_sees_the_same_pai_contract_on_every_backend(
    project: Path, cli_backend: CliBackend, tmp_path: Path
) -> None:
    write_probe_project(project)
    result = run_paiexp(project, "job=probe", "-q", *cli_backend.overrides, env=cli_backend.env)
    assert result.returncode == 0, result.stderr
    (run,) = all_runs(project)
    fetched = tmp_path / "fetched"
    download = run_paiexp(project, "download", run.info.run_id, str(fetched), env=cli_backend.env)
    assert download.returncode == 0, download.stderr
    assert_contract_seen(json.loads((fetched / "seen.json").read_text()), PurePosixPath("/ml"))


def assert_contract_seen(seen: dict[str, Any], ml: PurePath) -> None:
    """What the probe saw is the PAI contract, with the /ml tree rooted at ``ml``."""
    assert seen["ml_tree"] == ML_TREE
    assert seen["file"] == AS_STRINGS
    assert seen["pai_hps"] == AS_STRINGS
    assert seen["hps_env"] == {
        "PAI_HPS_EPOCHS": "10",
        "PAI_HPS_BATCH_SIZE": "32",
        "PAI_HPS_TRAIN_LEARNING_RATE": "0.001",
        "PAI_HPS_NOTE": AS_STRINGS["note"],
        "PAI_HPS_FLAG": "true",
    }
    assert seen["user_args"] == {
        "epochs": "10",
        "batch_size": "32",
        "train.learning_rate": "0.001",
        "note": AS_STRINGS["note"],
        "flag": "true",
    }
    assert seen["inputs"] == {
        "PAI_INPUT_TRAIN": {"kind": "file", "content": "a,b\n1,2\n"},
        "PAI_INPUT_SHARDS": {"kind": "dir", "files": ["part-0.csv", "part-1.csv"]},
    }
    assert seen["outputs"] == {
        "PAI_OUTPUT_MODEL": str(ml / "output" / "model"),
        "PAI_OUTPUT_CHECKPOINTS": str(ml / "output" / "checkpoints"),
        "PAI_OUTPUT_TENSORBOARD": str(ml / "output" / "tensorboard"),
        "PAI_OUTPUT_EXTRA": str(ml / "output" / "extra"),
        # numbers the job reports, one file each: a channel PAI jobs are given too
        "PAI_OUTPUT_OUTPUT_PARAMETERS": str(ml / "output" / "output_parameters"),
        # the job's own MLflow store's (paiexp.contract.job_mlflow), a channel of PAI jobs too
        "PAI_OUTPUT_PAIEXP_MLFLOW": str(ml / "output" / "paiexp_mlflow"),
    }
    assert seen["cwd"] == seen["working_dir"] == str(ml / "usercode")
    assert seen["config_dir"] == str(ml / "input" / "config")
    assert seen["usercode"] == ["probe.py"]
    assert seen["code_is_usercode"]
    assert seen["custom_env"] == "custom value"
