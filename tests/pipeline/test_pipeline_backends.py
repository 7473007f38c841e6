"""One pipeline on every backend, unchanged: a job step whose model a later step takes as its
input, whatever URI that backend gave it (file:// here, oss:// on PAI), on a condition over
the first step's metric."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_backends import CliBackend
from conftest import run_paiexp
from pipeline_helpers import pipeline_runs, starter_project, state, statuses, write_pipeline

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

STEPS = {
    "train": {"overrides": {"job": {"hyperparameters": {"n_estimators": 20}}}},
    "publish": {
        "job": "publish",
        "depends": ["train"],
        "when": 'steps.train.metrics["test-auc"] > 0.5',
        "overrides": {"job": {"inputs": {"model": "${steps.train.outputs.model}"}}},
    },
}


def test_a_step_takes_the_model_an_earlier_step_made(
    tmp_path: Path, cli_backend: CliBackend
) -> None:
    root = starter_project(tmp_path)
    write_pipeline(root, "handoff", STEPS)
    done = run_paiexp(root, "+pipeline=handoff", "-q", *cli_backend.overrides, env=cli_backend.env)
    assert done.returncode == 0, done.stderr
    assert statuses(root, "handoff") == {"train": "succeeded", "publish": "succeeded"}
    steps = state(root, "handoff")["steps"]
    model = steps["train"]["results"]["outputs"]["model"]
    assert steps["publish"]["config"]["job"]["inputs"]["model"] == model
    _, runs, _ = pipeline_runs(root)
    (train,), (publish,) = runs["train"], runs["publish"]
    assert train.data.tags["paiexp.model_uri"] == model
    assert publish.data.metrics["test-auc"] == train.data.metrics["test-auc"]
