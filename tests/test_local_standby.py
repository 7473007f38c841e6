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
from paiexp.config import LocalBackendConfig
from paiexp.jsonfiles import read_json
from paiexp.processes import process_alive
from paiexp.spec import JobSpec


def make_backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(LocalBackendConfig(root=str(tmp_path / "jobs")), tmp_path)


def wait_for(backend: LocalBackend, handle: JobHandle) -> JobStatus:
    def ended() -> JobStatus | None:
        status = backend.poll([handle])[handle.id]
        return status if status.state.terminal else None

    return wait_until(ended, 60, f"job {handle.name} to end")


def test_a_sweep_hands_its_jobs_to_runners_started_ahead(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    backend.set_concurrency(2)
    ready = [process.pid for process in backend._standby.ready]
    assert len(ready) == 2
    # Waiting, they see the launcher's mounts; each job's own /ml comes with the job.
    mounts = os.readlink("/proc/self/ns/mnt")
    assert [os.readlink(f"/proc/{pid}/ns/mnt") for pid in ready] == [mounts, mounts]
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
    assert state["runner_pid"] == ready[0]  # the oldest standby runner ran it
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    lines = backend.read_logs(handle, 0, final=True).lines
    assert lines == [f"x=7 threads={threads} cwd=/ml/usercode", "only-in-the-job"]
    assert len(backend._standby.ready) == 2  # replaced at once, for the next job


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
    runner = backend._standby.ready[0].pid
    needed = {"_hashlib", "_socket"} if warm_start else {"_hashlib"}
    wait_until(lambda: needed <= loaded_libraries(runner), 30, "the standby runner's imports")
    if not warm_start:
        assert "_socket" not in loaded_libraries(runner)
    backend._standby.dismiss()


def test_a_standby_runner_whose_launcher_is_gone_leaves_without_a_job(tmp_path: Path) -> None:
    """The launcher's end of the pipe closes when it dies: the runner exits, running nothing."""
    root = str(tmp_path / "jobs")
    script = "\n".join(
        [
            "import sys, time",
            "from pathlib import Path",
            "from paiexp.backends.local import LocalBackend",
            "from paiexp.config import LocalBackendConfig",
            f"backend = LocalBackend(LocalBackendConfig(root={root!r}), Path('/'))",
            "backend.set_concurrency(1)",
            "print(backend._standby.ready[0].pid, flush=True)",
            "time.sleep(600)",
        ]
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    runner = int(launcher.stdout.readline())
    assert process_alive(runner, None)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    wait_until(lambda: not process_alive(runner, None), 30, "the orphaned standby runner to exit")
    assert not (tmp_path / "jobs").exists()


def test_standby_runners_are_released_with_their_backend(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    backend.set_concurrency(3)
    processes = list(backend._standby.ready)
    backend._standby.dismiss()
    assert [process.returncode for process in processes] == [0, 0, 0]
    assert backend._standby.ready == type(backend._standby.ready)()
