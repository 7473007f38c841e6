"""paiexp as a library: jobs and sweeps from Python, over the command line's own code paths.

A job composed from keyword arguments alone runs and is tracked as a CLI run is; mistakes
raise ``paiexp.ConfigError`` with the CLI's one line, before anything is tracked; a sweep
launched without waiting outlives the process that launched it and is attached from another;
a sweep started from the command line is read and stopped from Python while it runs.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    all_runs,
    assert_nothing_started,
    assert_one_line_error,
    clean_env,
    run_paiexp,
    wait_until,
)
from gates import Gates
from sweep_helpers import load_study, running_jobs, synthetic_project

import paiexp

HEAVY = ("mlflow", "optuna", "oss2", "docker", "alibabacloud_paistudio20220112", "pandas")
METRICS = [{"name": "acc", "regex": r"acc=([0-9.]+)"}]


def python(root: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``code`` run by a Python process of its own (its jobs' executions in ledger.txt)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=root,
        env=clean_env(LEDGER=str(root / "ledger.txt")),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_import_paiexp_loads_no_heavy_library(tmp_path: Path) -> None:
    done = python(
        tmp_path,
        f"""
        import sys
        import paiexp
        assert callable(paiexp.run) and callable(paiexp.start_sweep) and paiexp.ConfigError
        print(sorted(n for n in sys.modules if n.split(".")[0] in {HEAVY!r}))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_job_from_keyword_arguments_is_tracked_as_a_cli_run(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    settings: dict[str, Any] = {"name": backend}
    if backend == "docker":
        settings["image"] = request.getfixturevalue("docker_image")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(
        "import json, os\n"
        "hps = json.loads(os.environ['PAI_HPS'])\n"
        "print(f\"acc={hps['lr']}\")\n"
        "open(os.path.join(os.environ['PAI_OUTPUT_MODEL'], 'm.txt'), 'w').write('m')\n"
    )
    job = paiexp.run(
        paiexp.job(
            name="kw",
            command="python3 train.py",
            source_dir="code",
            hyperparameters={"lr": 0.5},
            metric_definitions=METRICS,
            backend=settings,
            project=tmp_path,
        )
    )
    assert job.status == "SUCCEEDED"
    assert job.metrics["acc"] == 0.5 and set(job.metrics) == {"acc", "instance_hours"}
    assert job.metric_series("acc") == [(0, 0.5)]
    assert "acc=0.5" in job.log()
    assert job.download(tmp_path / "fetched") == [tmp_path / "fetched" / "m.txt"]
    assert job.run_id in job.ui_url and job.ui_url.endswith("?workflowType=machine_learning")

    # the same job from a conf/ project by the command line: the same kind of run
    conf = tmp_path / "cli"
    (conf / "conf" / "job").mkdir(parents=True)
    (conf / "conf" / "config.yaml").write_text(
        "defaults: [paiexp_schema, {job: kw}, {backend: local}, {tracker: mlflow}, _self_]\n"
    )
    for group in ("backend", "tracker"):
        source = Path(paiexp.__file__).parent / "starter" / "conf" / group
        (conf / "conf" / group).symlink_to(source)
    job_yaml = {
        "name": "kw",
        "command": "python3 train.py",
        "source_dir": str(tmp_path / "code"),
        "hyperparameters": {"lr": 0.5},
        "metric_definitions": METRICS,
    }
    (conf / "conf" / "job" / "kw.yaml").write_text(json.dumps(job_yaml))
    done = run_paiexp(conf, "-q", f"backend={backend}", *_image(settings))
    assert done.returncode == 0, done.stderr
    (api_run,) = all_runs(tmp_path)
    (cli_run,) = all_runs(conf)
    assert set(api_run.data.tags) == set(cli_run.data.tags)
    assert set(api_run.data.params) == set(cli_run.data.params)
    assert set(api_run.data.metrics) == set(cli_run.data.metrics) == {"acc", "instance_hours"}
    assert api_run.data.metrics["acc"] == cli_run.data.metrics["acc"] == 0.5
    assert api_run.info.status == cli_run.info.status == "FINISHED"


def test_a_job_run_without_waiting_is_followed_and_streamed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="paiexp.terminal")
    gate = tmp_path / "go"
    command = f"echo acc=0.1; while [ ! -e {gate} ]; do sleep 0.05; done; echo acc=0.9"
    job = paiexp.run(
        paiexp.job(command=command, metric_definitions=METRICS, project=tmp_path), wait=False
    )
    lines = job.stream()
    assert next(lines) == "acc=0.1"  # while the job runs (it waits for the gate)
    assert job.status == "RUNNING"
    gate.touch()
    assert list(lines) == ["acc=0.9"]
    assert job.wait(timeout=60).metric_series("acc") == [(0, 0.1), (1, 0.9)]
    (run,) = all_runs(tmp_path)
    assert run.info.status == "FINISHED" and run.info.run_id == job.run_id
    # what the command line prints is the program's to show: nothing on the terminal itself
    assert "[paiexp]" not in capfd.readouterr().err
    said = [r.getMessage() for r in caplog.records if r.name == "paiexp.terminal"]
    assert any(f"job {job.name} submitted to backend=local" in line for line in said), said

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name_or_id in (job.name, job.run_id):
        again = paiexp.attach_job(name_or_id, tracker_uri=store)
        assert (again.name, again.run_id, again.status) == (job.name, job.run_id, "SUCCEEDED")
    with pytest.raises(paiexp.ConfigError, match="tracks a job 'nope'"):
        paiexp.attach_job("nope", tracker_uri=store)


def _image(settings: dict[str, Any]) -> list[str]:
    return [f"backend.image={settings['image']}"] if "image" in settings else []


def project_with_sweep(root: Path, **sweep: Any) -> Path:
    settings = {
        "params": {"x": "interval(-1, 1)", "duration": 0.2, "steps": 2, "model": "true"},
        "n_trials": 4,
        "parallelism": 2,
        "sampler": {"name": "random", "seed": 7},
        **sweep,
    }
    return synthetic_project(root, settings)


MISTAKES: dict[str, tuple[str, ...]] = {
    "unknown override key": ("compose", "job.comand=x"),
    "wrong type": ("compose", "job.instance_count=two"),
    "bad search space": ("compose", "+sweep=syn", "sweep.params.x=interval(1)"),
    "unknown sweep": ("compose", "+sweep=nope"),
    "unknown backend": ("compose", "backend=nope"),
    "missing input": ("compose", "+job.inputs.train=missing.csv"),
    "bad metric regex": ("compose", "job.metric_definitions=[{name: a, regex: nogroup}]"),
    "unquoted value": ("compose", "job.command=sleep", "15"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_raises_config_error_with_the_clis_line(tmp_path: Path, mistake: str) -> None:
    root = project_with_sweep(tmp_path)
    _, *overrides = MISTAKES[mistake]
    with pytest.raises(paiexp.ConfigError) as raised:
        paiexp.from_project(*overrides, project=root)
    line = assert_one_line_error(run_paiexp(root, *overrides))
    assert line == f"paiexp: error: {raised.value}"
    assert_nothing_started(root)


KEYWORD_MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "unknown key": ({"comand": "x"}, "job.comand: unknown key"),
    "wrong type": ({"instance_count": "two"}, "job.instance_count"),
    "empty command": ({"command": " "}, "job.command: must not be empty"),
    "unknown backend": ({"backend": "nope"}, "backend.name: invalid value 'nope'"),
    "missing input": ({"inputs": {"train": "missing.csv"}}, "job.inputs.train"),
    "bad hyperparameter": ({"hyperparameters": {"a": [1]}}, "job.hyperparameters.a"),
    "bad metric regex": ({"metric_definitions": [{"name": "a", "regex": "x"}]}, "capture"),
    # a value of the wrong shape is named, never a TypeError of Python's
    "hyperparameters not a mapping": (
        {"hyperparameters": "lr=0.1"},
        "job.hyperparameters: expected a mapping (a dict), got str 'lr=0.1'",
    ),
    "requirements a string": ({"requirements": "numpy"}, "job.requirements: expected a list"),
    "mlflow metrics a string": ({"mlflow_metrics": "loss"}, "job.mlflow_metrics: expected a list"),
    "mlflow metric a log metric": (
        {
            "metric_definitions": [{"name": "loss", "regex": "loss=(.*)"}],
            "mlflow_metrics": ["loss"],
        },
        "job.mlflow_metrics[0]: metric name 'loss' is a job.metric_definitions",
    ),
    "metric definition not a mapping": (
        {"metric_definitions": [5]},
        "job.metric_definitions[0]: expected a mapping",
    ),
    "backend not a mapping": ({"backend": 5}, "backend: expected a mapping (a dict), got int 5"),
    "backend name a list": ({"backend": {"name": ["local"]}}, "backend.name: invalid value"),
    "tracker not a mapping": ({"tracker": "sqlite:///x.db"}, "tracker: expected a mapping"),
    "project not a path": ({"project": b"."}, "project: expected a directory's path"),
    "project not a directory": (
        {"project": "/nonexistent/paiexp-test"},
        "project: '/nonexistent/paiexp-test' is not a directory",
    ),
    # what no file system holds, and what MLflow would not open
    "checkpoints with a NUL": ({"checkpoints": "a\x00b"}, "job.checkpoints: 'a\\x00b' is not"),
    "checkpoints too long": ({"checkpoints": "c" * 5000}, "File name too long"),
    "tracker a file store": ({"tracker": {"uri": "pai"}}, "tracker.uri: 'pai' is a local path"),
    "tracker in memory": ({"tracker": {"uri": "sqlite://"}}, "in memory"),
    "experiment empty": ({"tracker": {"experiment": ""}}, "tracker.experiment: invalid value"),
    "poll interval nan": ({"backend": {"poll_interval": float("nan")}}, "backend.poll_interval"),
    # a character that would break the line is written as its escape
    "unknown key with a line break": ({"a\x85b": 1}, "job.a\\x85b: unknown key"),
}


@pytest.mark.parametrize("mistake", list(KEYWORD_MISTAKES))
def test_a_keyword_mistake_raises_config_error_naming_the_key(tmp_path: Path, mistake: str) -> None:
    given, said = KEYWORD_MISTAKES[mistake]
    with pytest.raises(paiexp.ConfigError, match=re.escape(said)) as raised:
        paiexp.job(**{"command": "true", "project": tmp_path, **given})
    assert "\n" not in str(raised.value)
    assert_nothing_started(tmp_path)


def test_a_job_from_keyword_arguments_starts_from_checkpoints(tmp_path: Path) -> None:
    """Every key of the job schema is a keyword: ``checkpoints`` and ``mlflow_metrics`` too."""
    (tmp_path / "earlier").mkdir()
    composed = paiexp.job(command="true", checkpoints="earlier", project=tmp_path)
    assert composed.spec.checkpoints == str(tmp_path / "earlier")
    composed = paiexp.job(command="true", mlflow_metrics=["val/loss"], project=tmp_path)
    assert composed.spec.mlflow_metrics == ("val/loss",)
    assert_nothing_started(tmp_path)


def test_attaching_to_what_does_not_exist_raises_config_error(tmp_path: Path) -> None:
    root = project_with_sweep(tmp_path)
    with pytest.raises(paiexp.ConfigError, match="no study journal"):
        paiexp.attach_sweep("syn", project=root)
    with pytest.raises(paiexp.ConfigError, match="no MLflow store at"):
        paiexp.attach_job("nope", tracker_uri=f"sqlite:///{root / 'mlflow.db'}")
    with pytest.raises(paiexp.ConfigError, match="this config is a sweep; run it with paiexp"):
        paiexp.run(paiexp.from_project("+sweep=syn", project=root))
    with pytest.raises(paiexp.ConfigError, match="no MLflow store at"):
        paiexp.attach_sweep(run_id="0" * 32, project=root)
    assert_nothing_started(root)  # no mlflow.db, study or job made by looking


@pytest.mark.slow
def test_a_sweep_launched_without_waiting_outlives_the_process_that_launched_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project_with_sweep(tmp_path, n_trials=6)
    launched = python(
        root,
        f"""
        import paiexp
        sweep = paiexp.start_sweep("+sweep=syn", project={str(root)!r})
        print(sweep.study_name, sweep.process.pid)
        """,
    )
    assert launched.returncode == 0, launched.stderr
    study_name, _pid = launched.stdout.split()
    assert study_name == "syn"

    wait_until(lambda: (root / "optuna.journal").exists(), 60, "the launcher to open the study")
    sweep = paiexp.attach_sweep("syn", project=root)
    wait_until(lambda: sweep.counts()["complete"] >= 1, 120, "a trial of the sweep to complete")
    sweep.wait(timeout=240, progress=True)
    counts = sweep.counts()
    assert counts == {
        "complete": 6,
        "pruned": 0,
        "failed": 0,
        "rerun": 0,
        "preempted": 0,
        "running": 0,
    }
    log = next((root / ".paiexp" / "launchers").glob("syn-*.log")).read_text()
    said = re.search(r"^sweep 6/6 done \(6 complete, 0 pruned\).*$", log, re.MULTILINE)
    assert said, log  # what the CLI's status line said last
    # the same line, read from the study (all but the time taken, counted differently)
    assert sweep.status().rsplit(" · ", 1)[0] == said.group(0).rsplit(" · ", 1)[0]
    shown = capsys.readouterr().err.splitlines()  # not a terminal: a line per change
    assert shown[-1] == sweep.status() and len(shown) >= 2
    ledger = [json.loads(line)["x"] for line in (root / "ledger.txt").read_text().splitlines()]
    assert sorted(Counter(ledger).values()) == [1] * 6, "a job ran twice"

    parent_run = load_study(root).user_attrs["paiexp:parent_run_id"]
    by_run = paiexp.attach_sweep(run_id=parent_run, project=root)
    assert by_run.counts() == counts and by_run.status() == sweep.status()
    best = by_run.best
    results = by_run.results()
    assert len(results) == 6 and set(results["state"]) == {"COMPLETE"}
    assert best.value == results["score"].min() == load_study(root).best_value
    assert best.run_id == results.set_index("number").loc[best.number, "run_id"]
    assert best.job().metrics["score"] == best.value
    assert (Path(best.model_uri.removeprefix("file://")) / "model.txt").is_file()


@pytest.mark.slow
def test_a_cli_sweep_is_read_and_stopped_from_python_while_it_runs(tmp_path: Path) -> None:
    root = project_with_sweep(tmp_path, n_trials=6, parallelism=2)
    gates = Gates(root / "gates")  # each job runs until the test opens its gate
    with open(root / "launcher.log", "w") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+sweep=syn"],
            cwd=root,
            env=clean_env(LEDGER=str(root / "ledger.txt"), **gates.env()),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        gates.open(gates.wait_held(2))
        wait_until(lambda: (root / "optuna.journal").exists(), 60, "the study to exist")
        sweep = paiexp.attach_sweep("syn", project=root)
        wait_until(lambda: sweep.counts()["complete"] == 2, 120, "two trials to complete")
        gates.wait_held(2)  # the next two jobs run
        partial = sweep.results()
        assert (partial["state"] == "COMPLETE").sum() == 2
        assert (partial["state"] == "RUNNING").sum() == 2
        assert sweep.running
        sweep.stop()  # as Ctrl-C: the running jobs stop, their points run next launch
        assert launcher.wait(timeout=120) == 130, (root / "launcher.log").read_text()
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()
    assert (
        "interrupted: no new trials; stopping running jobs" in (root / "launcher.log").read_text()
    )
    assert sweep.counts()["running"] == 0

    again = run_paiexp(root, "+sweep=syn", timeout=240)
    assert again.returncode == 0, again.stderr
    results = sweep.results()
    done = results[results["state"] == "COMPLETE"]
    assert len(done) == 6 and done["run_id"].notna().all() and done["score"].notna().all()


@pytest.mark.slow
def test_a_sweep_stopped_with_detach_leaves_its_jobs_to_the_next_launch(tmp_path: Path) -> None:
    root = project_with_sweep(tmp_path, n_trials=3, parallelism=2)
    ledger, gate = root / "ledger.txt", root / "gate"
    env = clean_env(LEDGER=str(ledger), GATE=str(gate))  # its jobs run until the gate opens
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: len(running_jobs(root)) == 2, 120, "two jobs of the sweep to run")
        sweep = paiexp.attach_sweep("syn", project=root)
        sweep.stop(detach=True)  # a SIGTERM: no new trials, the jobs left running
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 130, err
    assert "leaving running jobs to a later launch" in err
    assert len(running_jobs(root)) == 2  # still running, detached
    assert sweep.counts()["running"] == 2

    gate.touch()
    again = run_paiexp(root, "+sweep=syn", env=env)
    assert again.returncode == 0, again.stderr
    assert "re-attaching" in again.stderr
    assert sweep.counts() == {
        "complete": 3,
        "pruned": 0,
        "failed": 0,
        "rerun": 0,
        "preempted": 0,
        "running": 0,
    }
    lines = ledger.read_text().splitlines()
    assert len(lines) == 3 == len(set(lines))  # no job ran twice


@pytest.mark.slow
def test_a_pipeline_started_from_python_reports_its_steps(tmp_path: Path) -> None:
    from pipeline_helpers import statuses, write_pipeline

    root = project_with_sweep(tmp_path)
    steps = {
        "train": {"overrides": {"job": {"hyperparameters": {"x": 0.5, "duration": 0.2}}}},
        "good": {"depends": ["train"], "when": 'steps.train.metrics["score"] < 1'},
        "bad": {"depends": ["train"], "when": 'steps.train.metrics["score"] >= 1'},
    }
    write_pipeline(root, "flow", steps)
    pipeline = paiexp.start_pipeline("+pipeline=flow", project=root)
    assert pipeline.wait(timeout=240).steps() == statuses(root, "flow")
    assert pipeline.steps() == {"train": "succeeded", "good": "succeeded", "bad": "skipped"}
    assert pipeline.results("train")["metrics"]["score"] == 0.25
    attached = paiexp.attach_pipeline("flow", project=root)
    assert attached.steps() == pipeline.steps() and not attached.running

    write_pipeline(root, "broken", {"a": {"depends": ["nope"]}})
    with pytest.raises(paiexp.ConfigError) as raised:
        paiexp.start_pipeline("+pipeline=broken", project=root)
    line = assert_one_line_error(run_paiexp(root, "+pipeline=broken"))
    assert line == f"paiexp: error: {raised.value}"
    with pytest.raises(paiexp.ConfigError) as composing:  # composing checks the steps too
        paiexp.from_project("+pipeline=broken", project=root)
    assert str(composing.value) == str(raised.value)
    assert not list((root / ".paiexp" / "launchers").glob("pipeline-broken-*"))


@pytest.mark.slow
def test_a_job_from_a_project_is_tracked_in_the_project_wherever_python_runs(
    tmp_path: Path,
) -> None:
    root = project_with_sweep(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = python(
        elsewhere,
        f"""
        import paiexp
        job = paiexp.run(paiexp.from_project("job.hyperparameters.duration=0.1",
                                             project={str(root)!r}))
        print(job.run_id, job.status)
        """,
    )
    assert done.returncode == 0, done.stderr
    run_id, status = done.stdout.split()
    assert status == "SUCCEEDED"
    (run,) = all_runs(root)  # as `python -m paiexp` run in the project tracks it
    assert run.info.run_id == run_id
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(root)
    assert not (elsewhere / "mlflow.db").exists() and not (elsewhere / "mlruns").exists()
