"""Standby runners of the local backend: a sweep's next jobs start on runners started ahead.

A standby runner is a real detached process waiting on a pipe; these tests hand it real jobs
and check that it runs them exactly as a runner started for the job would, and that one whose
launcher goes away leaves without running anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until

from paiexp.backends import JobHandle, JobState, JobStatus
from paiexp.backends.local import LocalBackend
from paiexp.config.schema import LocalBackendConfig
from paiexp.config.spec import JobSpec
from paiexp.util.jsonfiles import read_json
from paiexp.util.processes import process_alive


def make_backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(LocalBackendConfig(root=str(tmp_path / "jobs")), tmp_path)


def wait_for(backend: LocalBackend, handle: JobHandle) -> JobStatus:
    def ended() -> JobStatus | None:
        status = backend.poll([handle])[handle.id]
        return status if status.state.terminal else None

    return wait_until(ended, 60, f"job {handle.name} to end")


def test_a_sweep_hands_its_jobs_to_runners_forked_by_one_started_ahead(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    backend.set_concurrency(2)
    assert backend._standby.process is not None
    standby = backend._standby.process.pid
    # Waiting, it sees the launcher's mounts; each job's own /ml comes with the job.
    assert os.readlink(f"/proc/{standby}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    command = 'echo "x=$PAI_HPS_X threads=$OMP_NUM_THREADS cwd=$(pwd)"; echo "$SECRET_TOKEN"'
    spec = JobSpec(
        name="standby",
        command=command,
        hyperparameters={"x": "7"},
        environments={"SECRET_TOKEN": "only-in-the-job"},
    )
    handle = backend.submit(spec)
    assert wait_for(backend, handle).state is JobState.SUCCEEDED
    state = read_json(backend.job_dir("standby") / "state.json")
    assert state["runner_pid"] not in (standby, os.getpid())  # a runner of its own
    assert read_json(backend.job_dir("standby") / "spec.json")["name"] == "standby"
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    lines = backend.read_logs(handle, 0, final=True).lines
    assert lines == [f"x=7 threads={threads} cwd=/ml/usercode", "only-in-the-job"]
    assert backend._standby.process.pid == standby  # still there, for the next jobs


def loaded_libraries(pid: int) -> set[str]:
    """The shared libraries a process has mapped (C extension modules once imported)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name.split(".")[0] for line in maps if line.endswith(".so")}


@pytest.mark.parametrize("warm_start", [True, False])
def test_a_standby_runner_imports_what_its_job_will_need_before_the_job(
    tmp_path: Path, warm_start: bool
) -> None:
    """What a job's start needs is imported while the runner waits: the hash of the
    requirements' marker, and for a sweep with warm starts the warm start's socket."""
    config = LocalBackendConfig(root=str(tmp_path / "jobs"), warm_start=warm_start)
    backend = LocalBackend(config, tmp_path)
    backend.set_concurrency(1)
    assert backend._standby.process is not None
    runner = backend._standby.process.pid
    needed = {"_hashlib", "_socket"} if warm_start else {"_hashlib"}
    wait_until(lambda: needed <= loaded_libraries(runner), 30, "the standby runner's imports")
    if not warm_start:
        assert "_socket" not in loaded_libraries(runner)
    backend._standby.dismiss()


def test_a_standby_runner_whose_launcher_is_gone_leaves_without_a_job(tmp_path: Path) -> None:
    """The launcher's end of the pipe closes when it dies: the runner exits, running nothing."""
    runner = kill_a_launcher_after(tmp_path / "jobs")
    wait_until(lambda: not process_alive(runner, None), 30, "the orphaned standby runner to exit")
    assert not (tmp_path / "jobs").exists()


def kill_a_launcher_after(root: Path, *steps: str) -> int:
    """Start a launcher whose backend keeps a runner on standby, let it take ``steps``
    (Python lines), then SIGKILL it; the pid of its standby runner, alive as it was killed."""
    script = "\n".join(
        [
            "import time",
            "from pathlib import Path",
            "from paiexp.backends.local import LocalBackend",
            "from paiexp.config.schema import LocalBackendConfig",
            "from paiexp.config.spec import JobSpec",
            f"backend = LocalBackend(LocalBackendConfig(root={str(root)!r}), Path('/'))",
            "backend.set_concurrency(1)",
            *steps,
            "print(backend._standby.process.pid, flush=True)",
            "time.sleep(600)",
        ]
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    runner = int(launcher.stdout.readline())
    assert process_alive(runner, None)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    return runner


def test_jobs_handed_over_together_each_run_in_a_session_of_their_runner(tmp_path: Path) -> None:
    """As a runner started for its job: its own session (the job survives the launcher)."""
    backend = make_backend(tmp_path)
    backend.set_concurrency(3)
    command = "cut -d' ' -f6 /proc/self/stat"  # the shell's session
    handles = [backend.submit(JobSpec(name=f"job-{n}", command=command)) for n in range(3)]
    runners = set()
    for handle in handles:
        assert wait_for(backend, handle).state is JobState.SUCCEEDED
        runner = read_json(backend.job_dir(handle.name) / "state.json")["runner_pid"]
        assert backend.read_logs(handle, 0, final=True).lines == [str(runner)]
        runners.add(runner)
    assert len(runners) == 3


def test_a_standby_runner_that_died_is_replaced_and_its_job_still_runs(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    backend.set_concurrency(1)
    assert backend._standby.process is not None
    dead = backend._standby.process
    dead.kill()
    dead.wait()
    handle = backend.submit(JobSpec(name="after", command="echo ran"))
    assert wait_for(backend, handle).state is JobState.SUCCEEDED
    assert backend.read_logs(handle, 0, final=True).lines == ["ran"]
    assert backend._standby.process is not None and backend._standby.process.pid != dead.pid
    assert backend._standby.process.poll() is None


def test_a_job_handed_over_runs_on_after_its_launcher_is_killed(tmp_path: Path) -> None:
    """The standby runner leaves with its launcher; the runner it forked finishes the job."""
    root = tmp_path / "jobs"
    go = tmp_path / "go"
    standby = kill_a_launcher_after(
        root,
        f"command = 'while [ ! -e {go} ]; do sleep 0.05; done; echo done'",
        "backend.submit(JobSpec(name='detached', command=command))",
    )
    wait_until(lambda: not process_alive(standby, None), 30, "the standby runner to exit")
    go.touch()
    state_file = root / "detached" / "state.json"
    wait_until(
        lambda: (read_json(state_file) or {}).get("state") == "SUCCEEDED", 60, "the job's end"
    )
    assert (root / "detached" / "job.log").read_text() == "done\n"


def test_the_standby_runner_is_released_with_its_backend(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    backend.set_concurrency(3)
    process = backend._standby.process
    assert process is not None
    backend._standby.dismiss()
    assert process.returncode == 0
    assert backend._standby.process is None
