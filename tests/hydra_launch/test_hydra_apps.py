"""A Hydra app as it is, its multirun launched by ``hydra/launcher=paiexp``: each job a paiexp
job re-running the app from its own file, its outcome back as Hydra's ``JobReturn``, tracked
as MLflow runs under one parent; bad launcher settings refused before anything runs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import all_runs, assert_nothing_started, clean_env, wait_until
from gates import Gates, cleaned_up

from paiexp.tracking.mlflow_tracker import KIND_TAG, PARENT_RUN_TAG
from paiexp.util.processes import process_alive

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

APP = """
import logging
import os
import signal
import time
from pathlib import Path

import hydra

log = logging.getLogger(__name__)


class TooBig(Exception):
    pass


@hydra.main(version_base="1.3", config_path=".", config_name="config")
def main(cfg):
    log.info(f"training with lr={cfg.db.lr}")
    if cfg.db.lr == 5:
        raise TooBig(f"lr too big: {cfg.db.lr}")
    if cfg.db.lr == 6:
        raise type("Unpicklable", (Exception,), {})("made where it ran")
    if cfg.db.lr == 7:
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.db.lr == 8:  # held at its gate (tests/gates.py) until the test opens it
        held = Path(os.environ["GATES"], f"{os.getpid()}.held")
        Path(f"{held}.partial").write_text(str(os.getpid()))
        os.replace(f"{held}.partial", held)
        while not held.with_suffix(".open").exists():
            time.sleep(0.05)
    return {"score": cfg.db.lr * 2, "user": cfg.db.user}


if __name__ == "__main__":
    main()
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A Hydra app of its own: ``my_app.py`` beside its ``config.yaml``."""
    (tmp_path / "my_app.py").write_text(APP)
    (tmp_path / "config.yaml").write_text("db:\n  lr: 0.1\n  user: me\n")
    yield tmp_path


def run_app(app: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "my_app.py", *args],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
    )


DRIVER = """
import importlib, json, runpy, sys
from hydra._internal.hydra import Hydra

multirun = Hydra.multirun
outcome = {}


def capturing(self, *args, **kwargs):
    try:
        batches = multirun(self, *args, **kwargs)
    except Exception as exc:
        outcome["raised"] = [type(exc).__module__, type(exc).__name__, str(exc)]
        raise
    outcome["returns"] = [[ret.return_value for ret in batch] for batch in batches]
    outcome["dirs"] = [
        [ret.hydra_cfg.hydra.runtime.output_dir for ret in batch] for batch in batches
    ]
    return batches


Hydra.multirun = capturing
target = sys.argv[1]  # how the app is started: its file, its module, its console script's
sys.argv = [target, *sys.argv[2:]]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    elif ":" in target:
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)()
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
finally:
    with open("outcome.json", "w") as stream:
        json.dump(outcome, stream)
"""


LAUNCHED = ("hydra/launcher=paiexp", "hydra.sweep.dir=multirun")


def multirun(
    app: Path, *overrides: str, env: dict[str, str] | None = None, target: str = "my_app.py"
) -> dict[str, Any]:
    """``python my_app.py -m hydra/launcher=paiexp OVERRIDES``, and what Hydra's multirun
    returned (the launcher's JobReturns' values and directories) or raised (the first failed
    job's exception: its module, class and message), which that command drops."""
    (app / "drive.py").write_text(DRIVER)
    done = subprocess.run(
        [sys.executable, "drive.py", target, "-m", *LAUNCHED, *overrides],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=300,
        env=env or clean_env(),
    )
    outcome: dict[str, Any] = json.loads((app / "outcome.json").read_text())
    assert ("raised" in outcome) == (done.returncode != 0), done.stderr
    return outcome


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest) -> list[str]:
    """The launcher's overrides for each backend the app's jobs run on: here, or in
    containers that have Hydra but no paiexp (the test image's hydra variant)."""
    if request.param == "local":
        return []
    image = request.getfixturevalue("hydra_image")
    return ["hydra.launcher.backend=docker", f"hydra.launcher.job.image={image}"]


def test_installing_paiexp_registers_the_launcher_as_hydra_lists_its_plugins(app: Path) -> None:
    done = run_app(app, "--info", "plugins")
    assert done.returncode == 0, done.stderr
    launchers = done.stdout.split("Launcher:")[1].split("Sweeper:")[0]
    assert "PaiexpLauncher" in launchers.split()


def test_each_job_runs_the_app_again_and_its_return_value_comes_back(
    app: Path, backend: list[str]
) -> None:
    outcome = multirun(app, *backend, "db.lr=0.5,0.25")
    assert outcome["returns"] == [[{"score": 1.0, "user": "me"}, {"score": 0.5, "user": "me"}]]
    dirs = outcome["dirs"][0]
    assert dirs == [str(app / "multirun" / "0"), str(app / "multirun" / "1")]
    for num, lr in enumerate(["0.5", "0.25"]):
        workdir = Path(dirs[num])
        overrides = (workdir / ".hydra" / "overrides.yaml").read_text().strip()
        assert overrides == f"- db.lr={lr}"
        # Hydra's job log, written where the job ran (fetched back from a container)
        assert f"training with lr={lr}" in (workdir / "my_app.log").read_text()
        # the job re-ran the app from its file: its runner's file says so
        described = list((app / "multirun" / ".paiexp").glob(f"*/jobs/{num}/job.json"))
        assert len(described) == 1
        assert '"script": "my_app.py"' in described[0].read_text()


@pytest.mark.parametrize(
    "target, entry",
    [
        ("pkg.app", '{"script": null, "module": "pkg.app", "function": null}'),
        ("pkg.app:main", '{"script": null, "module": "pkg.app", "function": "main"}'),
    ],
    ids=["python -m", "console script"],
)
def test_an_app_started_as_a_module_or_a_console_script_runs_again_so(
    app: Path, target: str, entry: str
) -> None:
    package = app / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "app.py").write_text(APP.replace('config_path="."', 'config_path="conf"'))
    (package / "conf").mkdir()
    (package / "conf" / "__init__.py").write_text("")  # Hydra's pkg:// configs need it
    (app / "config.yaml").rename(package / "conf" / "config.yaml")
    outcome = multirun(app, "db.lr=0.5", target=target)
    assert outcome["returns"] == [[{"score": 1.0, "user": "me"}]]
    described = list((app / "multirun" / ".paiexp").glob("*/jobs/0/job.json"))
    assert f'"entry": {entry}' in described[0].read_text()


def test_a_task_that_raised_comes_back_failed_with_its_exception(
    app: Path, backend: list[str]
) -> None:
    outcome = multirun(app, *backend, "db.lr=0.5,5")
    # Hydra's sweeper raises the first failed job's exception: the app's own class, unpickled
    assert outcome["raised"] == ["__main__", "TooBig", "lr too big: 5"]


def test_an_exception_that_cannot_come_back_as_itself_is_named_by_its_type_and_message(
    app: Path,
) -> None:
    module, name, message = multirun(app, "db.lr=6")["raised"]
    assert (module, name) == ("paiexp.hydra_launch.launcher", "RemoteTaskError")
    assert message.startswith("__main__.Unpicklable: made where it ran")
    assert "Traceback" in message  # where it was raised, as the job saw it


def test_a_job_killed_before_its_task_ended_fails_saying_how_it_ended(app: Path) -> None:
    module, name, message = multirun(app, "db.lr=7")["raised"]
    assert (module, name) == ("paiexp.hydra_launch.launcher", "RemoteTaskError")
    assert "FAILED" in message and "without the task's outcome" in message
    assert "training with lr=7" in message  # its log's last lines


def test_every_job_is_an_mlflow_run_under_one_parent_with_the_apps_config(app: Path) -> None:
    done = run_app(app, "-m", "hydra/launcher=paiexp", "db.lr=0.5,0.25", "db.user=you")
    assert done.returncode == 0, done.stderr
    runs = all_runs(app)
    parents = [run for run in runs if run.data.tags.get(KIND_TAG) == "multirun"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["paiexp.hydra.app"] == "my_app.py"
    children = [run for run in runs if run.data.tags.get(PARENT_RUN_TAG) == parent.info.run_id]
    assert len(children) == 2 and len(runs) == 3
    by_lr = {run.data.params["db.lr"]: run for run in children}
    assert sorted(by_lr) == ["0.25", "0.5"]
    for lr, run in by_lr.items():
        assert run.info.status == "FINISHED"
        assert run.data.params["db.user"] == "you"
        assert run.data.tags["paiexp.overrides"] == f"db.lr={lr} db.user=you"


def test_a_failed_job_fails_its_run_and_the_parent(app: Path) -> None:
    done = run_app(app, "-m", "hydra/launcher=paiexp", "db.lr=0.5,5")
    assert done.returncode == 1
    assert "TooBig: lr too big: 5" in done.stderr
    runs = all_runs(app)
    statuses = {run.data.params.get("db.lr"): run.info.status for run in runs}
    assert statuses == {None: "FAILED", "0.5": "FINISHED", "5": "FAILED"}


def test_an_app_whose_defaults_select_the_launcher_runs_as_it_is(app: Path) -> None:
    (app / "config.yaml").write_text(
        textwrap.dedent(
            """\
            defaults:
              - override hydra/launcher: paiexp
              - _self_
            hydra:
              launcher:
                parallelism: 1
                tracker:
                  experiment: my-app
            db:
              lr: 0.1
              user: me
            """
        )
    )
    done = run_app(app, "-m", "db.lr=0.5,0.25")
    assert done.returncode == 0, done.stderr
    runs = all_runs(app)
    assert {run.data.params.get("db.lr") for run in runs} == {None, "0.5", "0.25"}
    assert all(run.info.status == "FINISHED" for run in runs)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "hydra.launcher.job.instance_count=0",
            "hydra.launcher.job.instance_count: invalid value 0; expected a whole number >= 1",
        ),
        (
            "hydra.launcher.backend=nope",
            "hydra.launcher.backend.name: invalid value 'nope'; expected one of",
        ),
        ("hydra.launcher.job.source_dir=missing", "hydra.launcher.job.source_dir: "),
        ("+hydra.launcher.job.inputs.hydra=/tmp", "hydra.launcher.job.inputs.hydra: "),
    ],
)
def test_bad_launcher_settings_are_one_line_and_nothing_runs(
    app: Path, override: str, message: str
) -> None:
    done = run_app(app, "-m", "hydra/launcher=paiexp", "db.lr=0.5,0.25", override)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"paiexp: error: {message}"), done.stderr
    assert_nothing_started(app)
    sweep_dirs = list((app / "multirun").glob("*/*"))
    assert len(sweep_dirs) == 1
    assert sorted(path.name for path in sweep_dirs[0].iterdir()) == ["multirun.yaml"]


@pytest.fixture(params=["pai", "openpai"])
def platform(
    request: pytest.FixtureRequest, tmp_path: Path, hydra_image: str
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """A remote backend's settings (as the command line's overrides) and environment: the PAI
    emulator or a fake OpenPAI cluster, their jobs in containers that have Hydra, no paiexp."""
    if request.param == "openpai":
        from test_openpai_backend import cluster_for, openpai_env, openpai_overrides

        server = cluster_for(request)
        yield openpai_overrides(server, hydra_image), openpai_env(server)
        return
    from emulator import Emulator
    from test_pai_backend import assert_code_uploaded_once, pai_env, pai_overrides

    with Emulator(tmp_path / "cloud", local_images={"default": hydra_image}) as cloud:
        yield pai_overrides(cloud), pai_env(cloud)
        assert not cloud.pai.leaked_containers()
        assert_code_uploaded_once(cloud)  # the app's code, once for every job


def launcher_config(overrides: list[str]) -> dict[str, Any]:
    """``hydra.launcher``'s backend and job settings from the command line's overrides of a
    paiexp job (``backend=pai``, ``backend.oss.bucket=...``, ``job.instance_type=...``)."""
    settings: dict[str, Any] = {"backend": {}, "job": {}}
    for override in overrides:
        key, value = override.split("=", 1)
        if key == "backend":
            key = "backend.name"
        *parents, leaf = key.split(".")
        node = settings
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return settings


def test_on_a_platform_each_job_runs_in_its_container_and_its_outputs_come_back(
    app: Path, platform: tuple[list[str], dict[str, str]]
) -> None:
    overrides, env = platform
    config = {
        "defaults": [{"override hydra/launcher": "paiexp"}, "_self_"],
        "hydra": {"launcher": launcher_config(overrides)},
        "db": {"lr": 0.1, "user": "me"},
    }
    (app / "config.yaml").write_text(yaml.safe_dump(config))
    outcome = multirun(app, "db.lr=0.5,5", env=env)
    assert outcome["raised"] == ["__main__", "TooBig", "lr too big: 5"]
    workdir = app / "multirun" / "0"  # fetched back from the platform's storage
    assert (workdir / ".hydra" / "overrides.yaml").read_text().strip() == "- db.lr=0.5"
    assert "training with lr=0.5" in (workdir / "my_app.log").read_text()
    runs = all_runs(app)
    assert {run.data.params.get("db.lr"): run.info.status for run in runs} == {
        None: "FAILED",
        "0.5": "FINISHED",
        "5": "FAILED",
    }


@pytest.mark.timeout(600)  # deadlines for a busy machine: each wait below ends on its event
def test_ctrl_c_stops_every_job_of_the_multirun_and_ends_their_runs(app: Path) -> None:
    gates = Gates(app / "gates")
    held_in = f"+hydra.launcher.job.environments.GATES={gates.directory}"
    launcher = subprocess.Popen(
        [sys.executable, "my_app.py", "-m", "hydra/launcher=paiexp", "db.lr=8,8.0", held_in],
        cwd=app,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        held = gates.wait_held(2, timeout=300)  # the premise: both jobs run when Ctrl-C comes
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=180)
    finally:
        launcher.kill()
    assert launcher.returncode != 0, output
    assert gates.held() == held  # never let go: only the stop ended them
    for job in held:
        pid = Gates.pid(job)
        wait_until(lambda pid=pid: not process_alive(pid, None), 30, f"job {pid} to end")
    runs = all_runs(app)
    assert sorted(run.info.status for run in runs) == ["KILLED"] * 3, output


def test_every_job_runs_the_code_the_multirun_started_with_whatever_is_edited_meanwhile(
    app: Path,
) -> None:
    """One job at a time: the first held at its gate while the app's file is edited; the
    second, started after the edit, still runs the code as it was."""
    gates = Gates(app / "gates")
    (app / "drive.py").write_text(DRIVER)
    launcher = subprocess.Popen(
        [
            sys.executable,
            "drive.py",
            "my_app.py",
            "-m",
            *LAUNCHED,
            "hydra.launcher.parallelism=1",
            f"+hydra.launcher.job.environments.GATES={gates.directory}",
            "db.lr=8,0.5",
        ],
        cwd=app,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with cleaned_up(gates, [launcher]):
        held = gates.wait_held(1, timeout=300)
        script = app / "my_app.py"
        script.write_text(script.read_text().replace("cfg.db.lr * 2", "cfg.db.lr * 3"))
        assert not (app / "multirun" / "1").exists()  # the premise: the second job not begun
        gates.open(held)
        assert launcher.wait(timeout=300) == 0
    outcome = json.loads((app / "outcome.json").read_text())
    assert [ret["score"] for ret in outcome["returns"][0]] == [16, 1.0]
