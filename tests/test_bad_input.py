"""The CLI's bad-input contract: a user mistake is one line on stderr and exit code 2.

Every case runs ``python -m paiexp`` in a copy of the project and checks that nothing was
started: no MLflow store, no job directory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import (
    REPO,
    assert_nothing_started,
    assert_one_line_error,
    run_paiexp,
    run_without_heavy_imports,
)


def make_project(directory: Path) -> Path:
    """A copy of the repository's conf/ and examples/, plus a job config missing its command."""
    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, directory / name)
    (directory / "conf" / "job" / "incomplete.yaml").write_text("name: x\n")
    return directory


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    mentions: tuple[str, ...]
    in_project: bool = True


def case(*args: str, mentions: tuple[str, ...], in_project: bool = True) -> Case:
    return Case(args=args, mentions=mentions, in_project=in_project)


CASES = {
    "unknown-key": case("job.foo=1", mentions=("job.foo", "command", "valid keys")),
    "wrong-type": case("job.instance_count=abc", mentions=("job.instance_count", "abc")),
    "bad-backend": case("backend=nope", mentions=("backend", "nope", "local")),
    "unknown-job-config": case("job=nope", mentions=("job", "nope", "xgb")),
    "missing-required-field": case("job=incomplete", mentions=("job.command", "missing")),
    "regex-without-group": case(
        'job.metric_definitions=[{name: m, regex: "loss=\\d+"}]',
        mentions=("metric_definitions", "exactly one"),
    ),
    "regex-with-two-groups": case(
        'job.metric_definitions=[{name: m, regex: "(a)=(b)"}]',
        mentions=("metric_definitions", "exactly one", "2 capture groups"),
    ),
    "uncompilable-regex": case(
        'job.metric_definitions=[{name: m, regex: "("}]',
        mentions=("metric_definitions", "compile"),
    ),
    "bad-metric-name": case(
        'job.metric_definitions=[{name: "a:b", regex: "x=(\\d+)"}]',
        mentions=("metric_definitions", "a:b"),
    ),
    "duplicate-metric-name": case(
        'job.metric_definitions=[{name: m, regex: "x=(\\d+)"}, {name: m, regex: "y=(\\d+)"}]',
        mentions=("metric_definitions[1]", "'m'", "twice"),
    ),
    "missing-input-path": case(
        "job.inputs.train=nowhere.csv", mentions=("job.inputs.train", "nowhere.csv")
    ),
    "invalid-channel-name": case(
        "+job.inputs.bad-name=examples/xgb/data/train.csv",
        mentions=("job.inputs", "bad-name", "channel name"),
    ),
    "missing-checkpoints-dir": case(
        "job.checkpoints=nowhere", mentions=("job.checkpoints", "nowhere", "existing directory")
    ),
    "local-backend-oss-checkpoints": case(
        "job.checkpoints=oss://bucket/ckpt/",
        mentions=("job.checkpoints", "oss://bucket/ckpt/", "backend=local"),
    ),
    "local-backend-oss-input": case(
        "+job.inputs.extra=oss://bucket/data.csv",
        mentions=("job.inputs.extra", "oss://bucket/data.csv", "backend=local"),
    ),
    "bad-oss-uri": case(
        "job.inputs.train=oss://B", mentions=("job.inputs.train", "oss://B", "bucket")
    ),
    "reserved-output-channel": case(
        "+job.outputs.output_parameters=null", mentions=("job.outputs", "output_parameters")
    ),
    "invalid-job-name": case("job.name=1bad", mentions=("job.name", "1bad", "letter")),
    "job-name-too-long": case(f"job.name=a{'b' * 40}", mentions=("job.name", "1-40")),
    "empty-command": case("job.command= ", mentions=("job.command", "empty")),
    "source-dir-not-a-directory": case(
        "job.source_dir=missing_dir", mentions=("job.source_dir", "missing_dir", "directory")
    ),
    "pai-environment-name": case(
        "+job.environments.PAI_X=1", mentions=("job.environments", "PAI_X", "PAI_")
    ),
    "list-hyperparameter": case(
        "+job.hyperparameters.bad=[1,2]",
        mentions=("job.hyperparameters.bad", "string, number or boolean"),
    ),
    "null-hyperparameter": case(
        "job.hyperparameters.max_depth=null", mentions=("job.hyperparameters.max_depth",)
    ),
    "unparsable-override": case("job.name==", mentions=("override", "job.name==")),
    "install-requirements": case(
        "backend.install_requirements=sometimes",
        mentions=("backend.install_requirements", "sometimes", "auto", "always", "never"),
    ),
    "poll-interval-zero": case("backend.poll_interval=0", mentions=("backend.poll_interval",)),
    "pai-without-workspace": case(
        "backend=pai", mentions=("backend.workspace_id", "required", "backend=pai")
    ),
    "pai-without-bucket": case(
        "backend=pai",
        "backend.workspace_id=123",
        mentions=("backend.oss.bucket", "required"),
    ),
    "pai-bad-job-type": case(
        "backend=pai",
        "backend.workspace_id=123",
        "backend.oss.bucket=b",
        "backend.job_type=SparkJob",
        mentions=("backend.job_type", "SparkJob", "PyTorchJob", "XGBoostJob"),
    ),
    "pai-bad-spot-strategy": case(
        "backend=pai",
        "backend.workspace_id=123",
        "backend.oss.bucket=b",
        "backend.spot.strategy=Cheap",
        mentions=("backend.spot.strategy", "Cheap", "SpotAsPriceGo"),
    ),
    "openpai-without-rest-server": case(
        "backend=openpai", mentions=("backend.rest_server_uri", "required", "backend=openpai")
    ),
    "instance-count-zero": case("job.instance_count=0", mentions=("job.instance_count", ">= 1")),
    "local-instance-count-beyond-the-cpus": case(
        "job.instance_count=100000",
        mentions=("job.instance_count", "100000", "CPUs", "expected 1 to"),
    ),
    "job-type-pai-does-not-know": case(
        "job.job_type=SparkJob",
        mentions=("job.job_type", "SparkJob", "PyTorchJob", "TFJob", "XGBoostJob", "MPIJob"),
    ),
    "max-run-time-zero": case("job.max_run_time=0", mentions=("job.max_run_time",)),
    "unresolvable-interpolation": case(
        "job.command=${oc.env:PAIEXP_TEST_NO_SUCH_VARIABLE}",
        mentions=("job.command", "PAIEXP_TEST_NO_SUCH_VARIABLE"),
    ),
    "unknown-package": case("--cfg", "job", "--package", "nope", mentions=("--package", "nope")),
    "no-conf-directory": case(mentions=("conf", "paiexp init"), in_project=False),
    "no-conf-directory-cfg": case(
        "--cfg", "job", mentions=("conf", "paiexp init"), in_project=False
    ),
    "missing-config-path": case("--config-path", "nowhere", mentions=("nowhere", "config.yaml")),
    "missing-config-dir": case("-cd", "nowhere", mentions=("--config-dir", "nowhere", "not found")),
    "unknown-option": case("--bogus", mentions=("--bogus",)),
    "rerun-without-run-id": case(
        "rerun", mentions=("required: RUN_ID (", "paiexp rerun [OPTIONS] RUN_ID [KEY=VALUE ...]")
    ),
    "download-without-dest": case(
        "download", "abc", mentions=("required: DEST (", "RUN_ID DEST [KEY=VALUE ...]")
    ),
    "comma-list-without-multirun": case(
        "job.hyperparameters.max_depth=3,5", mentions=("job.hyperparameters.max_depth", "-m")
    ),
    "multirun-without-sweep-override": case("-m", "job.name=x", mentions=("-m", "KEY=a,b,c")),
    "multirun-over-config-group": case(
        "-m", "backend=local,docker", mentions=("backend=local,docker", "config group")
    ),
    "multirun-over-interval": case(
        "-m", "job.hyperparameters.gamma=interval(0,1)", mentions=("interval", "+sweep=NAME")
    ),
    "multirun-and-cfg": case("-m", "--cfg", "job", "job.name=a,b", mentions=("only one of",)),
    "multirun-unknown-key": case(
        "-m", "job.hyperparameters.max_depth=3,5", "job.foo=1", mentions=("job.foo", "unknown key")
    ),
    "info-bad-override": case(
        "--info", "searchpath", "job.foo=1", mentions=("job.foo", "unknown key")
    ),
    "unknown-metric-definition-key": case(
        'job.metric_definitions=[{name: m, regex: "x=(\\d+)", foo: 1}]',
        mentions=("job.metric_definitions", "foo", "regex"),
    ),
    "hydra-setting": case("hydra.run.dir=x", mentions=("hydra.run.dir",)),
}


@pytest.mark.parametrize("bad", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_one_line_exit_2_and_starts_nothing(tmp_path: Path, bad: Case) -> None:
    cwd = make_project(tmp_path) if bad.in_project else tmp_path
    done = run_paiexp(cwd, *bad.args)

    line = assert_one_line_error(done)
    for text in bad.mentions:
        assert text in line, f"{text!r} not in {line!r}"
    assert_nothing_started(tmp_path)


def test_cfg_job_prints_composed_job(tmp_path: Path) -> None:
    cwd = make_project(tmp_path)
    done = run_paiexp(cwd, "--cfg", "job")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "xgb-breast-cancer" in done.stdout
    data = yaml.safe_load(done.stdout)
    assert data["job"]["name"] == "xgb-breast-cancer"
    assert_nothing_started(tmp_path)


def test_cfg_and_bad_input_do_not_import_heavy_modules(tmp_path: Path) -> None:
    cwd = make_project(tmp_path)
    done = run_without_heavy_imports(
        cwd,
        [
            (["--cfg", "job"], 0),
            (["job.foo=1"], 2),
            (["backend=pai"], 2),
            (["backend=openpai"], 2),
            (["-m", "backend=local,docker"], 2),
            (["-m", "job.hyperparameters.max_depth=3,5", "job.foo=1"], 2),
        ],
    )
    assert done.returncode == 0, done.stderr
    assert "xgb-breast-cancer" in done.stdout
