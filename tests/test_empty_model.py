"""A job that succeeded without writing its model is never a silent, empty model URI."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import all_runs, run_paiexp

WARNING = "succeeded but left its model channel empty"


def write_job(project: Path, command: str) -> None:
    job = {"name": "nomodel", "command": command, "metric_definitions": []}
    (project / "conf" / "job" / "nomodel.yaml").write_text(yaml.safe_dump(job))


def test_an_empty_model_channel_is_warned_and_tagged(project: Path) -> None:
    write_job(project, "echo trained; mkdir -p $PAI_OUTPUT_MODEL/empty-subdir")
    result = run_paiexp(project, "job=nomodel", "-q")
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
