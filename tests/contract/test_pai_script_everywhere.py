"""A PAI training script that knows only absolute ``/ml`` paths runs unchanged on every
backend (as PAI's CustomJob example does): hyperparameters and an input channel read from
``/ml/input``, the model and a metric written under ``/ml/output``. Nothing is left in the
host's own ``/ml``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_backends import CliBackend
from conftest import all_runs, run_paiexp

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

SCRIPT = """\
import json
import os

with open("/ml/input/config/hyperparameters.json") as stream:
    hps = json.load(stream)
with open("/ml/input/data/train/rows.csv") as stream:
    rows = stream.read().splitlines()
os.makedirs("/ml/output/model", exist_ok=True)
with open("/ml/output/model/model.txt", "w") as stream:
    stream.write(f"rows={len(rows)} depth={hps['max_depth']}\\n")
with open("/ml/code/README", "r") as stream:  # the older name of /ml/usercode
    assert stream.read() == "code\\n"
with open("/ml/output/output_parameters/test-accuracy", "w") as stream:
    stream.write(str(0.5 + int(hps["max_depth"]) / 16))
"""


def write_project(project: Path) -> None:
    (project / "pai_script").mkdir()
    (project / "pai_script" / "train.py").write_text(SCRIPT)
    (project / "pai_script" / "README").write_text("code\n")
    (project / "rows").mkdir()
    (project / "rows" / "rows.csv").write_text("a,b\n1,2\n3,4\n")
    job = {
        "name": "absolute-ml",
        "command": "python train.py",
        "source_dir": "pai_script",
        "hyperparameters": {"max_depth": 4},
        "inputs": {"train": "rows"},
        "metric_definitions": [],
    }
    (project / "conf" / "job" / "absolute.yaml").write_text(yaml.safe_dump(job))


def test_a_script_with_absolute_ml_paths_runs_unchanged(
    project: Path, cli_backend: CliBackend, tmp_path: Path
) -> None:
    assert not Path("/ml").exists(), "this test needs a host without /ml"
    write_project(project)
    try:
        result = run_paiexp(
            project, "job=absolute", "-q", *cli_backend.overrides, env=cli_backend.env
        )
        assert result.returncode == 0, result.stderr
        assert "warning" not in result.stderr, result.stderr
        (run,) = all_runs(project)
        assert run.info.status == "FINISHED"
        assert run.data.metrics["test-accuracy"] == 0.75
        fetched = tmp_path / "fetched"
        download = run_paiexp(
            project, "download", run.info.run_id, str(fetched), env=cli_backend.env
        )
        assert download.returncode == 0, download.stderr
        assert (fetched / "model.txt").read_text() == "rows=3 depth=4\n"
        assert not Path("/ml").exists(), f"backend={cli_backend.name} wrote the host's /ml"
    finally:
        if Path("/ml").exists() and not any(Path("/ml").iterdir()):
            Path("/ml").rmdir()  # an empty left-over; the assertion above reported it
