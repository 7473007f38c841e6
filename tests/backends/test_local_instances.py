"""Multi-instance jobs on backend=local: cooperating instances, one job, real processes.

The DDP example trains on 2 instances with Debian's PyTorch (python3-torch, found by the
job's ``torchrun``); the other jobs are shell commands that meet at files (a barrier of
files: an instance waits for another's file, never for a time).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, all_runs, clean_env, job_end, mlflow_client, run_paiexp, wait_until
from ddp_helpers import assert_trained_in_step
from gates import Gates, cleaned_up
from sweep_helpers import MEDIAN_PRUNER, load_study, synthetic_project
from test_local_backend import pid_gone

from paiexp.backends import JobState
from paiexp.backends.local import LocalBackend
from paiexp.config.schema import LocalBackendConfig
from paiexp.config.spec import JobSpec
from paiexp.util.jsonfiles import read_json

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

GRACE = 1.0
# Each instance leaves "<rank>.up" in the model channel (shared by the instances), then waits
# for the file named by its WAIT_<rank> variable (none: it goes on at once).
MEET = (
    'touch "$PAI_OUTPUT_MODEL/$RANK.up"; '
    'eval wait_for=\\"\\${WAIT_$RANK:-}\\"; '
    'while [ -n "$wait_for" ] && [ ! -e "$wait_for" ]; do sleep 0.02; done; '
)


def make_backend(tmp_path: Path) -> LocalBackend:
    config = LocalBackendConfig(root=str(tmp_path / "jobs"), stop_grace_period=GRACE)
    return LocalBackend(config, tmp_path)


def instance_states(job_dir: Path) -> dict[str, dict]:
    return {d.name: read_json(d / "state.json") for d in (job_dir / "instances").iterdir()}


def assert_nothing_runs(job_dir: Path) -> None:
    """Neither the job's runner, nor an instance's runner or command, runs any more."""
    job = read_json(job_dir / "state.json")
    assert pid_gone(job["runner_pid"])
    for name, state in instance_states(job_dir).items():
        assert pid_gone(state["runner_pid"]), name
        if "pgid" in state:
            assert not group_members(state["pgid"]), name


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (zombies, their end not yet reaped, aside)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def both_up(job_dir: Path) -> bool:
    model = job_dir / "ml" / "output" / "model"
    return (model / "0.up").exists() and (model / "1.up").exists()


# -- the DDP example -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_python() -> None:
    """torchrun and a PyTorch for it (Debian: python3-torch; .ci/run installs it): fails,
    never skips, without them."""
    assert shutil.which("torchrun"), "no torchrun on PATH: apt-get install python3-torch"


def ddp_project(directory: Path) -> Path:
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, directory / name)
    return directory


def test_the_ddp_example_trains_on_two_instances_with_identical_parameters(
    tmp_path: Path, torch_python: None
) -> None:
    project = ddp_project(tmp_path)
    done = run_paiexp(project, "job=ddp", "job.hyperparameters.epochs=4")
    assert done.returncode == 0, done.stderr
    (job_dir,) = (project / ".paiexp" / "jobs").iterdir()
    logs = {d.name: (d / "job.log").read_text() for d in (job_dir / "instances").iterdir()}
    assert_trained_in_step(logs)
    assert [p.name for p in (job_dir / "ml" / "output" / "model").iterdir()] == ["model.pt"]

    client = mlflow_client(project)
    (run,) = all_runs(project)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2, 3]
    assert run.data.params["job.instance_count"] == "2"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, f"logs/{job_dir.name}")}
    assert artifacts == {f"logs/{job_dir.name}/master-0.log", f"logs/{job_dir.name}/worker-0.log"}
    worker_log = client.download_artifacts(
        run.info.run_id, f"logs/{job_dir.name}/worker-0.log", str(tmp_path)
    )
    assert Path(worker_log).read_text() == logs["worker-0"]


# -- one job, whatever its instances -----------------------------------------------------------


def test_a_failing_instance_fails_the_job_naming_it_and_the_others_are_stopped(
    tmp_path: Path,
) -> None:
    backend = make_backend(tmp_path)
    job_dir = tmp_path / "jobs" / "fails"
    model = job_dir / "ml" / "output" / "model"
    # the master runs on (deaf to SIGTERM: it takes the grace period's SIGKILL) once the
    # worker is up; the worker fails once the master is up
    command = (
        MEET + 'if [ "$RANK" = 1 ]; then echo "bad shard"; exit 1; fi; '
        "trap '' TERM; while true; do sleep 0.1; done"
    )
    spec = JobSpec(
        name="fails",
        command=command,
        instance_count=2,
        environments={"WAIT_0": str(model / "1.up"), "WAIT_1": str(model / "0.up")},
    )
    backend.validate(spec)
    status = job_end(backend, backend.submit(spec))

    assert status.state is JobState.FAILED
    assert status.reason == "worker-0 exited with code 1: bad shard"
    assert status.exit_code == 1
    states = instance_states(job_dir)
    assert states["worker-0"]["state"] == "FAILED"
    assert states["master-0"]["state"] == "STOPPED"
    assert status.ended_at is not None
    # the master was stopped within the grace period of the worker's exit (and its SIGKILL)
    assert status.ended_at - states["worker-0"]["ended_at"] < GRACE + 2.0
    assert_nothing_runs(job_dir)


def test_stop_stops_every_instance(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    job_dir = tmp_path / "jobs" / "stopped"
    spec = JobSpec(name="stopped", command=MEET + "exec sleep 300", instance_count=2)
    handle = backend.submit(spec)
    wait_until(lambda: both_up(job_dir), 60, "both instances to start")
    backend.stop(handle)
    status = job_end(backend, handle)
    assert status.state is JobState.STOPPED
    assert {s["state"] for s in instance_states(job_dir).values()} == {"STOPPED"}
    assert_nothing_runs(job_dir)


def test_max_run_time_holds_for_the_job(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    job_dir = tmp_path / "jobs" / "slow"
    spec = JobSpec(name="slow", command="exec sleep 300", instance_count=2, max_run_time=1)
    status = job_end(backend, backend.submit(spec))
    assert status.state is JobState.FAILED
    assert status.reason == "exceeded max_run_time of 1 s"
    assert {s["state"] for s in instance_states(job_dir).values()} == {"STOPPED"}
    assert_nothing_runs(job_dir)


def test_a_sigkilled_launcher_reattaches_to_every_instance_and_starts_none_twice(
    project: Path, tmp_path: Path
) -> None:
    ledger, go = tmp_path / "ledger", tmp_path / "go"
    # each instance notes its start, says it is up, then waits for the test's go
    command = (
        f'echo "$RANK" >> {ledger}; touch "$PAI_OUTPUT_MODEL/$RANK.up"; '
        f"while [ ! -e {go} ]; do sleep 0.02; done; echo test-auc=0.5"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "-q", f"job.command='{command}'", "job.instance_count=2"],
        cwd=project,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    jobs = project / ".paiexp" / "jobs"

    def started() -> Path | None:
        return next((d for d in jobs.glob("xgb-*") if both_up(d)), None) if jobs.exists() else None

    job_dir = wait_until(started, 60, "both instances to start")

    def held_running() -> bool:
        """Both instances run, held until the go (not given yet)."""
        states = instance_states(job_dir).values()
        return not go.exists() and [s["state"] for s in states] == ["RUNNING"] * 2

    assert held_running()
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    assert held_running()  # they run past the kill

    again = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "attach", job_dir.name, "-q"],
        cwd=project,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    go.touch()
    _, stderr = again.communicate(timeout=120)
    assert again.returncode == 0, stderr
    assert sorted(ledger.read_text().split()) == ["0", "1"]  # each instance started once
    client = mlflow_client(project)
    (run,) = all_runs(project)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test-auc"] == 0.5
    logged = {a.path for a in client.list_artifacts(run.info.run_id, f"logs/{job_dir.name}")}
    assert logged == {f"logs/{job_dir.name}/master-0.log", f"logs/{job_dir.name}/worker-0.log"}
    assert_nothing_runs(job_dir)


def test_a_sweep_of_two_instance_jobs_prunes_whole_jobs(tmp_path: Path) -> None:
    # Every instance is held at its gate once its steps are printed; the bad trial's never
    # opens, so it ends only by being pruned.  Its steps wait at start_gate, taken away before
    # the two good trials (run side by side) end and made again once both have completed:
    # the pruner judges it by them.
    steps = 5
    start_gate = tmp_path / "start"
    start_gate.touch()
    root = synthetic_project(
        tmp_path,
        {
            "params": {"x": "interval(-3, 3)", "duration": 0.2, "steps": steps},
            "n_trials": 3,
            "parallelism": 2,
            "sampler": {"name": "random", "seed": 0},
            "pruner": MEDIAN_PRUNER,
            "enqueue": [{"x": 0.0}, {"x": 0.1}, {"x": 2.9}],
        },
        job={
            "instance_count": 2,
            "command": 'until [ -e "$START_GATE" ]; do sleep 0.05; done; python job.py',
        },
    )
    gates = Gates(tmp_path / "gates")
    env = clean_env(START_GATE=str(start_gate), **gates.env())
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    with cleaned_up(gates, [launcher]):
        good = gates.wait_held(4)  # both instances of both good trials
        for number in (0, 1):
            wait_until(
                lambda n=number: len(load_study(root).trials[n].intermediate_values) == steps,
                120,
                f"trial {number}'s steps to be reported",
            )
        start_gate.unlink()  # the bad trial, not started yet, waits before its steps
        gates.open(good)
        wait_until(
            lambda: (
                [t.state.name for t in load_study(root).trials]
                == ["COMPLETE", "COMPLETE", "RUNNING"]
            ),
            120,
            "the good trials to complete, the bad one to run",
        )
        assert not gates.held() and not load_study(root).trials[2].intermediate_values
        start_gate.touch()
        _, err = launcher.communicate(timeout=120)  # the bad job is held: it cannot end itself
        assert launcher.returncode == 0, err
        assert len(gates.opened()) == 4  # not the bad trial's: it was stopped
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    job_dir = root / ".paiexp" / "jobs" / study.trials[2].user_attrs["paiexp:job_name"]
    assert read_json(job_dir / "state.json")["state"] == "STOPPED"
    assert {s["state"] for s in instance_states(job_dir).values()} == {"STOPPED"}
    assert_nothing_runs(job_dir)


def test_a_pipeline_step_and_a_rerun_run_the_job_on_every_instance(tmp_path: Path) -> None:
    from pipeline_helpers import statuses, write_pipeline

    root = synthetic_project(
        tmp_path,
        {"params": {"x": "interval(-1, 1)"}, "n_trials": 1},
        job={"instance_count": 2, "hyperparameters": {"x": 0.5, "duration": 0.1, "steps": 1}},
    )
    write_pipeline(root, "flow", {"train": {}, "check": {"depends": ["train"]}})
    done = run_paiexp(root, "+pipeline=flow")
    assert done.returncode == 0, done.stderr
    assert statuses(root, "flow") == {"train": "succeeded", "check": "succeeded"}
    step_runs = [r for r in all_runs(root) if "paiexp.job_name" in r.data.tags]
    assert len(step_runs) == 2

    first = step_runs[0]
    again = run_paiexp(root, "rerun", first.info.run_id)
    assert again.returncode == 0, again.stderr
    (rerun,) = [r for r in all_runs(root) if r.data.tags.get("paiexp.rerun_of")]
    assert rerun.data.params["job.instance_count"] == "2"
    assert rerun.data.metrics["score"] == first.data.metrics["score"] == 0.25
    for run in [*step_runs, rerun]:
        job_dir = root / ".paiexp" / "jobs" / run.data.tags["paiexp.job_name"]
        assert sorted(instance_states(job_dir)) == ["master-0", "worker-0"]
        assert {s["state"] for s in instance_states(job_dir).values()} == {"SUCCEEDED"}
        artifacts = {
            a.path
            for a in mlflow_client(root).list_artifacts(run.info.run_id, f"logs/{job_dir.name}")
        }
        assert len(artifacts) == 2, artifacts
