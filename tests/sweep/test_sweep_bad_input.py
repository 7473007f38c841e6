"""The CLI's bad-input contract for sweeps: one line on stderr, exit code 2, nothing started.

Every case runs ``python -m paiexp +sweep=...`` in a copy of the project (conf/, examples/ and
sweeps/) and checks that no MLflow store, job directory or Optuna journal was created.  None
of them runs a training job: each is rejected before the first trial.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import (
    REPO,
    assert_nothing_started,
    assert_one_line_error,
    clean_env,
    run_paiexp,
    run_without_heavy_imports,
)

from paiexp.cli import runs_a_sweep

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

MULTI_OBJECTIVE_WITH_PRUNER = """\
sweep:
  objective:
    - {metric: test-auc, direction: maximize}
    - {metric: validation-logloss, direction: minimize}
  params:
    max_depth: int(interval(2, 4))
  pruner:
    name: median
"""
NO_SWEEP_NODE = """\
objective: {metric: test-auc, direction: maximize}
params:
  max_depth: int(interval(2, 4))
"""
SWEEP_NODE_IS_A_LIST = "sweep: [1, 2]\n"
INVALID_YAML = "sweep: [\n"
DOTTED_KEY_TYPO = """\
sweep:
  objective: {metric: test-auc, direction: maximize}
  params:
    job.instance_typo: choice(a, b)
"""


def make_project(directory: Path, sweep_files: Mapping[str, str] | None = None) -> Path:
    """A copy of conf/, examples/ and sweeps/, plus extra ``sweeps/NAME.yaml`` files."""
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, directory / name)
    for name, text in (sweep_files or {}).items():
        (directory / "sweeps" / f"{name}.yaml").write_text(text)
    return directory


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    mentions: tuple[str, ...]
    absent: tuple[str, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)


def case(
    *args: str,
    mentions: tuple[str, ...],
    absent: tuple[str, ...] = (),
    files: Mapping[str, str] | None = None,
) -> Case:
    return Case(args=args, mentions=mentions, absent=absent, files=files or {})


CASES = {
    # selecting a sweep
    "unknown-sweep": case("+sweep=nope", mentions=("sweep=nope", "no such sweep", "xgb")),
    "sweep-without-plus": case("sweep=xgb", mentions=("sweep=xgb", "write +sweep=xgb")),
    "sweep-key-without-sweep": case(
        "sweep.n_trials=3", mentions=("sweep.n_trials", "+sweep=", "xgb")
    ),
    "sweep-file-without-sweep-node": case(
        "+sweep=broken",
        mentions=("broken.yaml", "sweep:"),
        files={"broken": NO_SWEEP_NODE},
    ),
    "sweep-node-is-a-list": case(
        "+sweep=listed",
        mentions=("listed.yaml", "sweep:"),
        files={"listed": SWEEP_NODE_IS_A_LIST},
    ),
    "invalid-yaml-sweep-file": case(
        "+sweep=garbled", mentions=("garbled.yaml",), files={"garbled": INVALID_YAML}
    ),
    "unknown-sweep-key": case(
        "+sweep=xgb", "sweep.nope=1", mentions=("sweep.nope", "unknown key", "n_trials")
    ),
    # objective
    "unknown-objective-metric": case(
        "+sweep=xgb",
        "sweep.objective.metric=nope",
        mentions=("sweep.objective.metric", "'nope'", "test-auc", "validation-logloss"),
    ),
    "objective-metric-a-tensorboard-tag-not-declared": case(
        "+sweep=xgb",
        "job.tensorboard.metrics=[loss]",
        "sweep.objective.metric=accuracy",
        mentions=("sweep.objective.metric", "'accuracy'", "job.tensorboard.metrics", "loss"),
    ),
    "bad-objective-direction": case(
        "+sweep=xgb",
        "sweep.objective.direction=up",
        mentions=("sweep.objective.direction", "'up'", "minimize", "maximize"),
    ),
    # sampler and pruner
    "unknown-sampler": case(
        "+sweep=xgb",
        "sweep.sampler.name=nope",
        mentions=("sweep.sampler.name", "'nope'", "tpe", "random"),
    ),
    "sampler-rejects-its-seed": case(
        "+sweep=xgb",
        "sweep.sampler.seed=-1",
        mentions=("sweep.sampler.options", "TPESampler", "-1"),
    ),
    "unknown-pruner": case(
        "+sweep=xgb",
        "sweep.pruner.name=nope",
        mentions=("sweep.pruner.name", "'nope'", "median", "none"),
    ),
    "unknown-pruner-metric": case(
        "+sweep=xgb", "sweep.pruner.metric=nope", mentions=("sweep.pruner.metric", "'nope'")
    ),
    "bad-pruner-direction": case(
        "+sweep=xgb",
        "sweep.pruner.direction=up",
        mentions=("sweep.pruner.direction", "'up'", "minimize"),
    ),
    "multi-objective-with-pruner": case(
        "+sweep=multi",
        mentions=("sweep.pruner.name", "multi-objective", "none"),
        files={"multi": MULTI_OBJECTIVE_WITH_PRUNER},
    ),
    # scalar settings
    "parallelism-zero": case(
        "+sweep=xgb", "sweep.parallelism=0", mentions=("sweep.parallelism", ">= 1", "0")
    ),
    "n-trials-zero": case(
        "+sweep=xgb", "sweep.n_trials=0", mentions=("sweep.n_trials", ">= 1", "0")
    ),
    "n-trials-not-a-number": case(
        "+sweep=xgb", "sweep.n_trials=abc", mentions=("sweep.n_trials", "abc")
    ),
    "retries-negative": case(
        "+sweep=xgb", "sweep.retries=-1", mentions=("sweep.retries", ">= 0", "-1")
    ),
    "max-failures-zero": case(
        "+sweep=xgb", "sweep.max_failures=0", mentions=("sweep.max_failures", ">= 1")
    ),
    "on-interrupt": case(
        "+sweep=xgb",
        "sweep.on_interrupt=maybe",
        mentions=("sweep.on_interrupt", "'maybe'", "stop", "detach"),
    ),
    "timeout-zero": case("+sweep=xgb", "sweep.timeout=0", mentions=("sweep.timeout", "> 0")),
    "storage-outage-timeout": case(
        "+sweep=xgb",
        "sweep.storage_outage_timeout=0",
        mentions=("sweep.storage_outage_timeout", "> 0", "0"),
    ),
    "tracker-outage-timeout": case(
        "+sweep=xgb", "tracker.outage_timeout=-5", mentions=("tracker.outage_timeout", "> 0", "-5")
    ),
    "timeout-nan": case("+sweep=xgb", "sweep.timeout=nan", mentions=("sweep.timeout", "nan")),
    "heartbeat-grace-inf": case(
        "+sweep=xgb", "sweep.heartbeat_grace=inf", mentions=("sweep.heartbeat_grace", "at most")
    ),
    "tracker-outage-timeout-nan": case(
        "+sweep=xgb", "tracker.outage_timeout=nan", mentions=("tracker.outage_timeout", "nan")
    ),
    "tracker-uri-a-bare-word": case(
        "+sweep=xgb", "tracker.uri=pai", mentions=("tracker.uri", "'pai'", "file store")
    ),
    "storage-empty": case(
        "+sweep=xgb", "sweep.storage=", mentions=("sweep.storage", "''", "a directory")
    ),
    "storage-a-directory": case(
        "+sweep=xgb", "sweep.storage=conf", mentions=("sweep.storage", "'conf'", "a directory")
    ),
    "storage-in-memory": case(
        "+sweep=xgb", "sweep.storage=sqlite://", mentions=("sweep.storage", "in memory")
    ),
    "storage-unknown-driver": case(
        "+sweep=xgb",
        "sweep.storage=postgresql+nodriver://host/db",
        mentions=("sweep.storage", "driver"),
    ),
    "enqueue-not-a-number": case(
        "+sweep=xgb",
        "sweep.enqueue=[{subsample: abc}]",
        mentions=("sweep.enqueue[0].subsample", "'abc'", "float[0.5, 1]"),
    ),
    "enqueue-nan": case(
        "+sweep=xgb",
        "sweep.enqueue=[{subsample: nan}]",
        mentions=("sweep.enqueue[0].subsample", "nan"),
    ),
    "enqueue-not-a-choice": case(
        "+sweep=xgb",
        "sweep.params.max_depth='choice(2,4)'",
        "sweep.enqueue=[{max_depth: 3}]",
        mentions=("sweep.enqueue[0].max_depth", "3", "choice(2, 4)"),
    ),
    # the search space
    "empty-range": case(
        "+sweep=xgb",
        "sweep.params.max_depth='range(5,5)'",
        mentions=("sweep.params.max_depth", "range(5, 5", "empty"),
    ),
    "list-param": case(
        "+sweep=xgb",
        "sweep.params.max_depth=[1,2]",
        mentions=("sweep.params.max_depth", "choice("),
    ),
    "param-function-wrong-arguments": case(
        "+sweep=xgb",
        "sweep.params.max_depth='interval(0.1)'",
        mentions=("sweep.params.max_depth", "interval(0.1)"),
    ),
    "job-key-typo-unquoted": case(
        "+sweep=xgb",
        "+sweep.params.job.instance_typo=choice(a,b)",
        mentions=("sweep.params.job.instance_typo",),
    ),
    "unquoted-sweep-value-advice": case(
        "+sweep=xgb",
        "sweep.params.max_depth=range(2,5)",
        mentions=("sweep.params.max_depth",),
        absent=("--multirun",),
    ),
    "job-key-typo-dotted-override": case(
        "+sweep=xgb",
        "+sweep.params.job.instance_typo='choice(a,b)'",
        mentions=("instance_typo",),
    ),
    "job-key-typo-flat-mapping": case(
        "+sweep=xgb",
        "+sweep.params={job.instance_typo: 'choice(a,b)'}",
        mentions=("sweep.params.job.instance_typo", "unknown key", "instance_type"),
    ),
    "job-key-typo-in-sweep-file": case(
        "+sweep=dotted",
        mentions=("sweep.params.job.instance_typo", "unknown key", "instance_type"),
        files={"dotted": DOTTED_KEY_TYPO},
    ),
    "enqueue-unknown-param": case(
        "+sweep=xgb",
        "+sweep.enqueue=[{nope: 1}]",
        mentions=("sweep.enqueue[0]", "'nope'", "max_depth"),
    ),
}


@pytest.mark.parametrize("bad", list(CASES.values()), ids=list(CASES))
def test_bad_sweep_is_one_line_exit_2_and_starts_nothing(tmp_path: Path, bad: Case) -> None:
    cwd = make_project(tmp_path, bad.files)
    done = run_paiexp(cwd, *bad.args)

    line = assert_one_line_error(done)
    for text in bad.mentions:
        assert text in line, f"{text!r} not in {line!r}"
    for text in bad.absent:
        assert text not in line, f"{text!r} in {line!r}"
    assert_nothing_started(tmp_path)


def test_cfg_job_prints_the_sweep_node(tmp_path: Path) -> None:
    cwd = make_project(tmp_path)
    done = run_paiexp(cwd, "+sweep=xgb", "--cfg", "job")

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "objective" in done.stdout
    assert "n_trials: 30" in done.stdout
    data = yaml.safe_load(done.stdout)
    sweep = data["sweep"]
    assert sweep["name"] == "xgb"
    assert sweep["objective"] == {"metric": "test-auc", "direction": "maximize"}
    assert sweep["params"]["n_estimators"] == "range(50, 301, 50)"
    assert data["job"]["name"] == "xgb-breast-cancer"
    assert_nothing_started(tmp_path)


def test_bad_sweep_does_not_import_optuna_or_mlflow(tmp_path: Path) -> None:
    cwd = make_project(tmp_path)
    done = run_without_heavy_imports(cwd, [(["+sweep=xgb", "sweep.sampler.name=nope"], 2)])
    assert done.returncode == 0, done.stderr


def processes_marked(marker: str) -> list[int]:
    """The processes whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def test_a_sweep_refused_before_it_begins_ends_its_early_tracking_process(
    tmp_path: Path,
) -> None:
    """The command starts a sweep's tracking process first (to load MLflow meanwhile); a sweep
    refused then ends with it, having written nothing."""
    cwd = make_project(tmp_path)
    marker = f"PAIEXP_TEST_MARK={uuid.uuid4().hex}"
    env = clean_env(**dict([marker.split("=")]))
    refused = run_paiexp(cwd, "+sweep=xgb", "sweep.sampler.name=nope", env=env)
    assert "sweep.sampler.name" in assert_one_line_error(refused)
    assert processes_marked(marker) == []
    assert_nothing_started(tmp_path)


@pytest.mark.parametrize(
    ("argv", "sweep"),
    [
        (["+sweep=xgb"], True),
        (["+sweep=xgb", "sweep.n_trials=3"], True),
        (["-m", "job.hyperparameters.max_depth=3,4"], True),
        (["--multirun", "x=1,2"], True),
        ([], False),
        (["job.hyperparameters.max_depth=3"], False),
        (["+sweep=xgb", "--cfg", "job"], False),
        (["+sweep=xgb", "--info"], False),
        (["+sweep=xgb", "--dry-run"], False),
        (["+sweep=xgb", "-h"], False),
        (["rerun", "+sweep=xgb"], False),
        (["+pipeline=train"], False),
    ],
)
def test_the_command_tells_a_sweep_from_its_command_line(argv: list[str], sweep: bool) -> None:
    assert runs_a_sweep(argv) is sweep
