"""Bad pipelines are one-line errors before anything runs: no MLflow store, job directory,
study or pipeline state is created, and no heavy library is imported to say so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import (
    REPO,
    SHIPPED_SWEEPS,
    assert_nothing_started,
    assert_one_line_error,
    run_paiexp,
    run_without_heavy_imports,
)

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

PIPELINES = {
    "unknown_depends": """
pipeline:
  steps:
    train: {}
    report: {depends: [trian]}
""",
    "cycle": """
pipeline:
  steps:
    a: {depends: [c]}
    b: {depends: [a]}
    c: {depends: [b]}
""",
    "malformed_when": """
pipeline:
  steps:
    train: {}
    report: {depends: [train], when: 'steps.train.metrics["test-auc"] >'}
""",
    "when_calls_a_function": """
pipeline:
  steps:
    train: {}
    report: {depends: [train], when: '__import__("os").system("touch hacked") == 0'}
""",
    "missing_best_param": """
pipeline:
  steps:
    search: {sweep: xgb}
    refit:
      depends: [search]
      overrides: {job: {hyperparameters: {max_depth: '${steps.search.best.params.max_dept}'}}}
""",
    "missing_result": """
pipeline:
  steps:
    train: {}
    publish: {depends: [train], when: 'steps.train.output.model == "x"'}
""",
    "missing_channel": """
pipeline:
  steps:
    train: {}
    publish:
      job: publish
      depends: [train]
      overrides: {job: {inputs: {model: '${steps.train.outputs.modle}'}}}
""",
    "undefined_metric": """
pipeline:
  steps:
    train: {}
    publish: {depends: [train], when: 'steps.train.metrics["test_auc"] >= 0.97'}
""",
    "not_a_dependency": """
pipeline:
  steps:
    train: {}
    report: {when: 'steps.train.status == "succeeded"'}
""",
    "unknown_sweep": """
pipeline:
  steps:
    search: {sweep: nope}
""",
    "unknown_job": """
pipeline:
  steps:
    train: {job: nope}
""",
    "step_key_typo": """
pipeline:
  steps:
    train: {dependz: [x]}
""",
    "override_key_typo": """
pipeline:
  steps:
    train: {overrides: {job: {comand: python x.py}}}
""",
    "step_sets_tracker": """
pipeline:
  steps:
    train: {overrides: {tracker.experiment: other}}
""",
}

CASES = {
    "unknown-pipeline": (("+pipeline=nope",), ("pipeline=nope", "no such pipeline", "xgb")),
    "unknown-depends": (
        ("+pipeline=unknown_depends",),
        ("pipeline.steps.report.depends", "unknown step 'trian'", "train, report"),
    ),
    "cycle": (("+pipeline=cycle",), ("pipeline.steps", "cycle", "a -> c -> b -> a")),
    "malformed-when": (("+pipeline=malformed_when",), ("pipeline.steps.report.when", "parse")),
    "when-calls-a-function": (
        ("+pipeline=when_calls_a_function",),
        ("pipeline.steps.report.when", "function call", "not allowed"),
    ),
    "missing-best-param": (
        ("+pipeline=missing_best_param",),
        ("steps.search.best.params has no 'max_dept'", "it has: colsample_bytree", "max_depth"),
    ),
    "missing-result": (
        ("+pipeline=missing_result",),
        ("steps.train has no 'output'", "it has: job_name, metrics", "outputs", "status"),
    ),
    "missing-channel": (
        ("+pipeline=missing_channel",),
        ("steps.train.outputs has no 'modle'", "checkpoints, model, tensorboard"),
    ),
    "undefined-metric": (
        ("+pipeline=undefined_metric",),
        (
            "pipeline.steps.publish.when",
            "steps.train.metrics has no 'test_auc'; it has: test-auc, validation-logloss",
            "its job's metric_definitions, tensorboard.metrics, mlflow_metrics and "
            "output_parameters",
        ),
    ),
    "not-a-dependency": (
        ("+pipeline=not_a_dependency",),
        ("report does not depend on train", "depends"),
    ),
    "unknown-sweep": (
        ("+pipeline=unknown_sweep",),
        ("pipeline.steps.search.sweep", "no such sweep 'nope'", f"available: {SHIPPED_SWEEPS}"),
    ),
    "unknown-job": (
        ("+pipeline=unknown_job",),
        ("pipeline.steps.train.job", "'nope'", "publish", "workflow", "xgb"),
    ),
    "step-key-typo": (
        ("+pipeline=step_key_typo",),
        ("pipeline.steps.train.dependz", "unknown key", "depends, when, overrides"),
    ),
    "override-key-typo": (
        ("+pipeline=override_key_typo",),
        ("pipeline.steps.train.overrides", "job.comand", "unknown key", "command"),
    ),
    "step-sets-tracker": (
        ("+pipeline=step_sets_tracker",),
        ("pipeline.steps.train.overrides.tracker.experiment", "share"),
    ),
    "sweep-and-pipeline": (("+pipeline=workflow", "+sweep=xgb"), ("+sweep", "pipeline")),
    "rerun-unknown-step": (
        ("+pipeline=workflow", "--rerun", "train_step_4"),
        ("--rerun", "unknown step 'train_step_4'", "train_step_1, train_step_2"),
    ),
    "rerun-without-pipeline": (("--rerun", "refit"), ("--rerun", "+pipeline=NAME")),
    "pipeline-key-without-pipeline": (
        ("pipeline.steps.search.overrides.sweep.n_trials=3",),
        ("pipeline.steps.search.overrides.sweep.n_trials", "+pipeline=NAME", "xgb"),
    ),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's project, with the bad pipelines beside its own."""
    root = tmp_path_factory.mktemp("bad-pipelines")
    for name in ("conf", "examples", "sweeps", "pipelines"):
        shutil.copytree(REPO / name, root / name)
    for name, text in PIPELINES.items():
        (root / "pipelines" / f"{name}.yaml").write_text(text)
    return root


@pytest.mark.parametrize("name", CASES)
def test_bad_pipeline_is_one_line_before_anything_runs(project: Path, name: str) -> None:
    args, mentions = CASES[name]
    line = assert_one_line_error(run_paiexp(project, *args))
    for text in mentions:
        assert text in line, f"{text!r} not in {line!r}"
    assert_nothing_started(project)
    assert not (project / "hacked").exists()


def test_bad_pipelines_need_no_heavy_import(project: Path) -> None:
    calls = [(list(args), 2) for args, _ in CASES.values()]
    done = run_without_heavy_imports(project, calls)
    assert done.returncode == 0, done.stderr
