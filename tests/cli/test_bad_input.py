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
    all_runs,
    assert_nothing_started,
    assert_one_line_error,
    clean_env,
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
    "unknown-key-added": case("+job.foo=1", mentions=("job.foo", "command", "valid keys")),
    "unknown-nested-key-added": case(
        "+job.metric_definitions.0.group=1",
        mentions=("job.metric_definitions[0].group", "name, regex"),
    ),
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
    "tensorboard-metric-bad-name": case(
        'job.tensorboard.metrics=[{name: "a:b", tag: loss}]',
        mentions=("job.tensorboard.metrics[0]", "'a:b'", "letters, digits"),
    ),
    "tensorboard-metric-not-a-tag": case(
        "job.tensorboard.metrics=[[loss]]",
        mentions=("job.tensorboard.metrics[0]", "['loss']", "{name: NAME, tag: TAG}"),
    ),
    "tensorboard-metric-unknown-key": case(
        "job.tensorboard.metrics=[{name: loss, tags: loss}]",
        mentions=("job.tensorboard.metrics[0]", "tags", "{name: NAME, tag: TAG}"),
    ),
    "tensorboard-metric-clashes-with-log-metric": case(
        "job.tensorboard.metrics=[test-auc]",
        mentions=("job.tensorboard.metrics[0]", "'test-auc'", "job.metric_definitions"),
    ),
    "tensorboard-tag-declared-twice": case(
        "job.tensorboard.metrics=[loss, {name: loss2, tag: loss}]",
        mentions=("job.tensorboard.metrics[1]", "tag 'loss'", "twice"),
    ),
    "tensorboard-unknown-key": case(
        "+job.tensorboard.scalars=all",
        mentions=("job.tensorboard.scalars", "metrics", "other_scalars"),
    ),
    "tensorboard-other-scalars-not-a-bool": case(
        "job.tensorboard.other_scalars=some",
        mentions=("job.tensorboard.other_scalars", "some"),
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
    "new-channel-without-plus": case(
        "job.inputs.extra=data.csv",
        mentions=("job.inputs.extra", "no such key yet", "+job.inputs.extra=VALUE"),
    ),
    "override-without-a-key": case("+=x", mentions=("'+=x'", "no key", "KEY=VALUE")),
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
    # the tracking store: what MLflow would refuse, or wait minutes for, refused first
    "tracker-uri-a-bare-word": case(
        "tracker.uri=pai",
        mentions=("tracker.uri", "'pai'", "local path", "file store", "MLFLOW_ALLOW_FILE_STORE"),
    ),
    "tracker-uri-file-store": case(
        "tracker.uri=file:./runs", mentions=("tracker.uri", "file:./runs", "file store")
    ),
    "tracker-uri-unknown-scheme": case(
        "tracker.uri=s3://bucket/runs",
        mentions=("tracker.uri", "'s3'", "sqlite:///PATH", "http(s)://HOST:PORT"),
    ),
    "tracker-uri-unity-catalog": case("tracker.uri=uc", mentions=("tracker.uri", "Unity Catalog")),
    "tracker-uri-in-memory": case("tracker.uri=sqlite://", mentions=("tracker.uri", "in memory")),
    "tracker-uri-not-a-database": case(
        "tracker.uri=sqlite:///conf/config.yaml",
        mentions=("tracker.uri", "conf/config.yaml", "not an SQLite database"),
    ),
    "tracker-uri-missing-directory": case(
        "tracker.uri=sqlite:///runs/mlflow.db",
        mentions=("tracker.uri", "runs", "not an existing directory"),
    ),
    "tracker-uri-unknown-driver": case(
        "tracker.uri=postgresql+nodriver://host/db",
        mentions=("tracker.uri", "postgresql+nodriver", "driver"),
    ),
    "tracker-uri-no-host": case("tracker.uri=http://", mentions=("tracker.uri", "no host")),
    "tracker-uri-no-database-server": case(
        "tracker.uri=postgresql://me:secret@127.0.0.1:1/runs",
        mentions=("tracker.uri", "no database server", "me:<redacted>@127.0.0.1:1"),
    ),
    "tracker-uri-databricks-without-credentials": case(
        "tracker.uri=databricks", mentions=("tracker.uri", "Databricks credentials")
    ),
    "tracker-job-uri-not-a-server": case(
        "tracker.job_uri=sqlite:///mlflow.db",
        mentions=("tracker.job_uri", "sqlite:///mlflow.db", "http(s)://HOST[:PORT]"),
    ),
    "tracker-job-uri-with-a-password": case(
        "tracker.job_uri=http://me:hunter2@mlflow.internal:5000",
        mentions=("tracker.job_uri", "me:<redacted>@mlflow.internal", "password"),
    ),
    "tracker-job-uri-without-a-server": case(
        "tracker.job_uri=http://mlflow.internal:5000",
        mentions=("tracker.job_uri", "tracking server", "tracker.uri", "mlflow.db"),
    ),
    "job-environment-mlflow-run-id": case(
        "+job.environments.MLFLOW_RUN_ID=abc", mentions=("job.environments", "MLFLOW_RUN_ID")
    ),
    "job-environment-mlflow-tracking-uri": case(
        "+job.environments.MLFLOW_TRACKING_URI=sqlite:///elsewhere.db",
        mentions=("job.environments", "MLFLOW_TRACKING_URI", "MLflow"),
    ),
    "job-output-own-mlflow-store": case(
        "+job.outputs.paiexp_mlflow=null", mentions=("job.outputs", "paiexp_mlflow")
    ),
    "tracker-experiment-empty": case(
        "tracker.experiment=", mentions=("tracker.experiment", "''", "1 to 500")
    ),
    "tracker-experiment-too-long": case(
        f"tracker.experiment={'e' * 501}", mentions=("tracker.experiment", "1 to 500")
    ),
    # numbers of seconds: NaN passes every "<= 0" check, and a huge one overflows the clocks
    "poll-interval-nan": case(
        "backend.poll_interval=nan", mentions=("backend.poll_interval", "nan")
    ),
    "poll-interval-huge": case(
        "backend.poll_interval=1e308", mentions=("backend.poll_interval", "at most")
    ),
    "stop-grace-period-nan": case(
        "backend.stop_grace_period=nan", mentions=("backend.stop_grace_period", ">= 0", "nan")
    ),
    "max-run-time-huge": case(
        "job.max_run_time=99999999999999999999", mentions=("job.max_run_time", "at most")
    ),
    "retry-delay-nan": case(
        "backend=pai",
        "backend.workspace_id=123",
        "backend.oss.bucket=b",
        "backend.retry.base_delay=nan",
        mentions=("backend.retry.base_delay", "nan"),
    ),
    # paths no file system holds, and a jobs' root that cannot be made
    "input-path-too-long": case(
        f"job.inputs.train={'a' * 5000}", mentions=("job.inputs.train", "not a usable path")
    ),
    "backend-root-under-a-file": case(
        "backend.root=conf/config.yaml/jobs",
        mentions=("backend.root", "conf/config.yaml", "not a writable directory"),
    ),
}


@pytest.mark.parametrize("bad", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_one_line_exit_2_and_starts_nothing(tmp_path: Path, bad: Case) -> None:
    cwd = make_project(tmp_path) if bad.in_project else tmp_path
    done = run_paiexp(cwd, *bad.args)

    line = assert_one_line_error(done)
    for text in bad.mentions:
        assert text in line, f"{text!r} not in {line!r}"
    assert_nothing_started(tmp_path)


def test_a_tracking_uri_from_the_environment_is_refused_naming_it(tmp_path: Path) -> None:
    cwd = make_project(tmp_path)
    done = run_paiexp(cwd, env=clean_env(MLFLOW_TRACKING_URI="pai"))

    line = assert_one_line_error(done)
    assert line.startswith("paiexp: error: MLFLOW_TRACKING_URI: 'pai' is a local path"), line
    assert_nothing_started(tmp_path)


def test_a_value_with_control_characters_stays_on_one_line(tmp_path: Path) -> None:
    cwd = make_project(tmp_path)
    done = run_paiexp(cwd, "tracker.uri='a\nb\x1b[31m'")

    line = assert_one_line_error(done)
    assert "'a\\nb\\x1b[31m'" in line, line
    assert_nothing_started(tmp_path)


@pytest.mark.slow
def test_a_job_its_backend_cannot_take_fails_in_one_line(tmp_path: Path) -> None:
    """A jobs' root no directory can be made in (/proc, even for root): refused in one line
    when the check sees it (exit 2), else the submission fails in one line (exit 1) and the
    job's run is FAILED, saying why."""
    cwd = make_project(tmp_path)
    done = run_paiexp(cwd, "-q", "backend.root=/proc/paiexp-test/jobs")

    if done.returncode == 2:
        line = assert_one_line_error(done)
        assert "backend.root" in line, line
        assert_nothing_started(tmp_path)
        return
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("paiexp: error: job xgb-breast-cancer-"), line
    assert "could not be submitted to backend=local" in line and "/proc/paiexp-test" in line
    (run,) = all_runs(tmp_path)
    assert run.info.status == "FAILED"
    assert "submission failed" in run.data.tags["paiexp.failure_reason"]


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
