"""backend=local gives each job a private ``/ml``: a mount namespace in which ``/ml`` is the
job directory's tree (a user namespace too for a user who is not root).  Where there is none
(here: ``PAIEXP_LOCAL_NAMESPACE=0``), the launcher says so once and a job that wrote under the
host's ``/ml`` fails, naming backend=docker.

Each scenario runs its jobs in a launcher process of its own, as ``paiexp`` would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env

HOST_ML = Path("/ml")
NOBODY = 65534

# Only absolute /ml paths; a shell script, since nobody (below) may not run every interpreter.
SCRIPT = """\
depth=$(sed -n 's/.*"depth": "\\(.*\\)".*/\\1/p' /ml/input/config/hyperparameters.json)
rows=$(wc -l < /ml/input/data/train/rows.csv)
echo "rows=$rows depth=$depth" > /ml/output/model/model.txt
echo "0.$depth" > /ml/output/output_parameters/accuracy
pwd
readlink /proc/self/ns/mnt
env | grep -E '^(PAI_(INPUT|OUTPUT|WORKING|CONFIG)|MLFLOW_TRACKING_URI)' | sort
"""

# Runs each job of argv[2] (JSON specs) on a LocalBackend rooted at argv[1], one after the
# other, and prints each one's outcome as JSON.
LAUNCHER = """\
import json, sys
from pathlib import Path
from paiexp.backends.local import LocalBackend
from paiexp.config.schema import LocalBackendConfig
from paiexp.config.spec import JobSpec

root = Path(sys.argv[1])
backend = LocalBackend(LocalBackendConfig(root=str(root / "jobs")), root)
outcomes = {}
for spec in json.loads(sys.argv[2]):
    handle = backend.submit(JobSpec.from_dict(spec))
    while not (status := backend.poll([handle])[handle.id]).state.terminal:
        backend.wait([handle], 1.0)
    outcomes[handle.name] = {
        "state": status.state.value,
        "reason": status.reason,
        "log": backend.read_logs(handle, 0, final=True).lines,
        "output_parameters": backend.output_parameters(handle),
        "job_dir": str(backend.job_dir(handle.name)),
    }
print(json.dumps(outcomes))
"""


def launch(
    directory: Path, specs: list[dict[str, Any]], *, as_nobody: bool = False, **env: str
) -> tuple[dict[str, Any], str]:
    """Each job's outcome, and what the launcher wrote on its console (stderr).

    ``as_nobody``: the launcher runs as the unprivileged user nobody when the tests run as
    root (else as the tests' own user). It keeps the right to look into any directory, as
    the interpreter may be where nobody may not look (pyenv's under /root); its jobs lose
    that right with the rest in their user namespace.
    """
    command = [sys.executable, "-c", LAUNCHER, str(directory), json.dumps(specs)]
    if as_nobody and os.geteuid() == 0:
        keep = ["--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]
        ids = [f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        command = ["setpriv", *ids, *keep, *command]
    done = subprocess.run(
        command,
        cwd=directory,
        env=clean_env(HOME=str(directory), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def job(name: str, command: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "command": command, **fields}


def training_job(project: Path) -> dict[str, Any]:
    """The script above, its code and data written in ``project``."""
    (project / "code").mkdir()
    (project / "code" / "train.sh").write_text(SCRIPT)
    (project / "rows").mkdir()
    (project / "rows" / "rows.csv").write_text("a,b\n1,2\n3,4\n")
    return job(
        "absolute",
        "sh train.sh",
        source_dir=str(project / "code"),
        hyperparameters={"depth": "6"},
        inputs={"train": str(project / "rows")},
    )


@pytest.fixture
def no_host_ml() -> Iterator[None]:
    """The host has no /ml before the test, and none after it (any left is removed)."""
    assert not HOST_ML.exists(), "these tests need a host without /ml"
    try:
        yield
    finally:
        created = HOST_ML.exists()
        shutil.rmtree(HOST_ML, ignore_errors=True)
        assert not created, "the host's /ml was created"


@pytest.fixture
def nobodys_dir() -> Iterator[Path]:
    """A directory of the user the launcher runs as with ``as_nobody`` (outside pytest's
    temporary directories, which only their owner may enter)."""
    directory = Path(tempfile.mkdtemp(prefix="paiexp-userns-"))
    try:
        if os.geteuid() == 0:
            os.chown(directory, NOBODY, NOBODY)
        yield directory
    finally:
        shutil.rmtree(directory)


def assert_private_ml_run(outcome: dict[str, Any]) -> None:
    """The job read and wrote its own tree through /ml, and saw /ml paths, as on PAI."""
    assert outcome["state"] == "SUCCEEDED", outcome
    assert outcome["output_parameters"] == {"accuracy": 0.6}
    job_dir = Path(outcome["job_dir"])
    assert (job_dir / "ml" / "output" / "model" / "model.txt").read_text() == "rows=3 depth=6\n"
    cwd, mount_namespace, *paths = outcome["log"]
    assert cwd == "/ml/usercode"
    assert mount_namespace != os.readlink("/proc/self/ns/mnt")  # the job's own
    assert paths == [
        "MLFLOW_TRACKING_URI=file:///ml/output/paiexp_mlflow/mlruns",  # the job's own MLflow
        "PAI_CONFIG_DIR=/ml/input/config",
        "PAI_INPUT_TRAIN=/ml/input/data/train",
        "PAI_OUTPUT_CHECKPOINTS=/ml/output/checkpoints",
        "PAI_OUTPUT_MODEL=/ml/output/model",
        "PAI_OUTPUT_OUTPUT_PARAMETERS=/ml/output/output_parameters",
        "PAI_OUTPUT_PAIEXP_MLFLOW=/ml/output/paiexp_mlflow",
        "PAI_OUTPUT_TENSORBOARD=/ml/output/tensorboard",
        "PAI_WORKING_DIR=/ml/usercode",
    ]
    state = json.loads((job_dir / "state.json").read_text())
    assert "no_private_ml" not in state
    assert sorted(path.name for path in job_dir.iterdir()) == [
        "job.log",
        "ml",
        "runner.lock",
        "spec.json",
        "state.json",
    ]


def test_a_job_writes_absolute_ml_paths_into_its_own_directory(
    tmp_path: Path, no_host_ml: None
) -> None:
    outcomes, console = launch(tmp_path, [training_job(tmp_path)])
    assert_private_ml_run(outcomes["absolute"])
    assert console == ""


def test_a_user_who_is_not_root_gets_a_private_ml_through_a_user_namespace(
    nobodys_dir: Path, no_host_ml: None
) -> None:
    outcomes, console = launch(nobodys_dir, [training_job(nobodys_dir)], as_nobody=True)
    assert_private_ml_run(outcomes["absolute"])
    assert console == ""
    model = Path(outcomes["absolute"]["job_dir"]) / "ml" / "output" / "model" / "model.txt"
    assert model.stat().st_uid == nobodys_dir.stat().st_uid  # the user's own file


def test_a_host_ml_is_hidden_from_the_job(tmp_path: Path, no_host_ml: None) -> None:
    (HOST_ML / "output" / "model").mkdir(parents=True)
    (HOST_ML / "host-file").write_text("the host's\n")
    try:
        outcomes, _ = launch(tmp_path, [job("hidden", "ls /ml; touch /ml/output/model/m")])
        assert outcomes["hidden"]["state"] == "SUCCEEDED", outcomes
        assert outcomes["hidden"]["log"] == ["code", "input", "output", "usercode"]
        assert sorted(path.name for path in HOST_ML.rglob("*")) == ["host-file", "model", "output"]
    finally:
        shutil.rmtree(HOST_ML)


def test_without_a_namespace_a_job_that_wrote_the_host_ml_fails(
    tmp_path: Path, no_host_ml: None
) -> None:
    writes = job("writes", "mkdir -p /ml/output/model && echo w > /ml/output/model/m")
    keeps_off = job("keeps-off", 'echo "$PAI_OUTPUT_MODEL"; echo 1 > "$PAI_OUTPUT_MODEL/m"')
    rewrites = job("rewrites", "echo v > /ml/output/model/m")  # same size, a new time
    jobs = [writes, keeps_off, rewrites]
    try:
        outcomes, console = launch(tmp_path, jobs, PAIEXP_LOCAL_NAMESPACE="0")
        assert HOST_ML.exists()
    finally:
        shutil.rmtree(HOST_ML, ignore_errors=True)
    for name in ["writes", "rewrites"]:
        assert outcomes[name]["state"] == "FAILED"
        assert outcomes[name]["reason"] == (
            "the job wrote under the host's /ml (this machine gives local jobs no private /ml: "
            "PAIEXP_LOCAL_NAMESPACE=0); use backend=docker"
        )
    assert outcomes["keeps-off"]["state"] == "SUCCEEDED", outcomes
    model_dir = Path(outcomes["keeps-off"]["job_dir"]) / "ml" / "output" / "model"
    assert outcomes["keeps-off"]["log"] == [str(model_dir)]  # the job directory's, as before
    assert (model_dir / "m").read_text() == "1\n"
    assert console.splitlines() == [  # one line for the whole launcher, not one per job
        "backend=local: this machine gives jobs no private /ml (PAIEXP_LOCAL_NAMESPACE=0): "
        "a job that writes under /ml is reported FAILED; use backend=docker for such scripts"
    ]
