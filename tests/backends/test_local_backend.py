"""The local process backend against real processes: sessions, process groups, runners.

What every backend does (idempotent submit, log cursor, stop, max_run_time, outputs, label,
validate) is in test_backend_contract.py; this file keeps what is the local backend's own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_stays, wait_until

from paiexp.backends import JobHandle, JobState, JobStatus
from paiexp.backends.local import LocalBackend
from paiexp.config.schema import LocalBackendConfig
from paiexp.config.spec import JobSpec
from paiexp.errors import UserError
from paiexp.util.jsonfiles import read_json
from paiexp.util.processes import process_alive


def make_backend(tmp_path: Path, **options: object) -> LocalBackend:
    return LocalBackend(LocalBackendConfig(root=str(tmp_path / "jobs"), **options), tmp_path)


def wait_for(backend: LocalBackend, handle: JobHandle, timeout: float = 60) -> JobStatus:
    def ended() -> JobStatus | None:
        status = backend.poll([handle])[handle.id]
        return status if status.state.terminal else None

    return wait_until(ended, timeout, f"job {handle.name} to end")


def read_all_logs(backend: LocalBackend, handle: JobHandle) -> list[str]:
    return backend.read_logs(handle, 0, final=True).lines


def pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_the_runner_leads_its_own_session_detached_from_the_launcher(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, stop_grace_period=1.0)
    handle = backend.submit(JobSpec(name="detached", command="echo up; sleep 60"))
    state_file = backend.job_dir("detached") / "state.json"

    def running_state() -> dict | None:
        state = read_json(state_file)
        return state if state and state["state"] == "RUNNING" else None

    state = wait_until(running_state, 30, "the runner to record the job RUNNING")
    runner = state["runner_pid"]
    assert os.getsid(runner) == runner  # checked while it runs: a session leader
    assert os.getsid(runner) != os.getsid(os.getpid())  # not the launcher's session
    backend.stop(handle)
    assert wait_for(backend, handle, timeout=30).state is JobState.STOPPED
    state = read_json(state_file)
    assert state["ended_at"] >= state["started_at"]


def test_failing_command_reports_its_exit_code(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    handle = backend.submit(JobSpec(name="fails", command="echo oops >&2; exit 3"))
    status = wait_for(backend, handle)
    assert status.state is JobState.FAILED
    assert status.exit_code == 3 and status.reason == "command exited with code 3"
    assert read_all_logs(backend, handle) == ["oops"]


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, stop_grace_period=2.0)
    pid_file = tmp_path / "child.pid"
    command = f"sleep 300 & echo $! > {pid_file}; echo started; wait"
    handle = backend.submit(JobSpec(name="stopme", command=command))
    wait_until(
        lambda: pid_file.exists() and pid_file.read_text().strip(),
        30,
        "the job to write its background process's pid",
    )
    grandchild = int(pid_file.read_text())
    assert not pid_gone(grandchild)
    backend.stop(handle)
    status = wait_for(backend, handle, timeout=30)
    assert status.state is JobState.STOPPED
    wait_until(lambda: pid_gone(grandchild), 5, "the job's background process to die on stop")


def test_stop_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, stop_grace_period=0.5)
    command = "trap '' TERM; echo ready; while true; do sleep 0.1; done"
    handle = backend.submit(JobSpec(name="stubborn", command=command))
    wait_until(lambda: "ready" in read_all_logs(backend, handle), 30, "the job to print ready")
    started = time.monotonic()
    backend.stop(handle)
    status = wait_for(backend, handle, timeout=30)
    assert status.state is JobState.STOPPED
    assert time.monotonic() - started < 10


def test_killed_runner_is_reported_as_failed(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    handle = backend.submit(JobSpec(name="orphan", command="echo up; sleep 60"))
    state_file = backend.job_dir("orphan") / "state.json"
    # The command may print before its runner has recorded the process group: wait for both.
    wait_until(lambda: "up" in read_all_logs(backend, handle), 30, "the job to print up")
    launch = wait_until(
        lambda: (state := read_json(state_file)) and "pgid" in state and state,
        30,
        "the runner to record the command's process group",
    )
    os.kill(launch["runner_pid"], 9)
    wait_until(
        lambda: not process_alive(launch["runner_pid"], launch["runner_start"]),
        10,
        "the SIGKILLed runner to die",
    )
    status = backend.poll([handle])[handle.id]
    assert status.state is JobState.FAILED and "runner" in (status.reason or "")
    backend.stop(handle)  # kills the orphaned command's group
    pgid = launch["pgid"]
    wait_until(lambda: pid_gone(pgid), 5, "the orphaned command's group to die on stop")


def test_requirements_already_satisfied_are_not_installed(tmp_path: Path) -> None:
    source = tmp_path / "code"
    source.mkdir()
    (source / "requirements.txt").write_text("pytest>=1\n# a comment\n")
    backend = make_backend(tmp_path)
    spec = JobSpec(
        name="reqs", command="echo done", source_dir=str(source), requirements=("packaging",)
    )
    handle = backend.submit(spec)
    assert wait_for(backend, handle).state is JobState.SUCCEEDED
    lines = read_all_logs(backend, handle)
    assert lines[0] == "[paiexp] requirements already satisfied: packaging, pytest>=1"
    assert lines[-1] == "done"


def test_failed_requirements_install_fails_the_job(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    spec = JobSpec(
        name="badreqs",
        command="echo never",
        requirements=("paiexp-no-such-package-anywhere==0.0.1",),
    )
    handle = backend.submit(spec)
    status = wait_for(backend, handle, timeout=120)
    assert status.state is JobState.FAILED
    assert "requirements" in (status.reason or "")
    assert "never" not in read_all_logs(backend, handle)


def test_job_python_is_the_launchers_interpreter(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    handle = backend.submit(
        JobSpec(name="which", command="python -c 'import sys; print(sys.prefix)'")
    )
    assert wait_for(backend, handle).state is JobState.SUCCEEDED
    assert read_all_logs(backend, handle) == [sys.prefix]


def test_bad_backend_settings_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="install_requirements"):
        make_backend(tmp_path, install_requirements="sometimes")


def test_a_second_runner_never_runs_the_job_again(tmp_path: Path) -> None:
    """A launcher that died after starting a runner leaves it invisible to the next one,
    which may start another: the job still runs once."""
    ledger = tmp_path / "ledger"
    backend = make_backend(tmp_path)
    spec = JobSpec(name="once", command=f"echo ran >> {ledger}; sleep 1")
    handle = backend.submit(spec)
    job_dir = backend.job_dir("once")
    for _ in range(3):  # what a racing or restarted launcher would do
        backend._start_runner(job_dir, backend._environment(spec, job_dir))
    assert wait_for(backend, handle).state is JobState.SUCCEEDED
    for _ in range(2):  # and after the job ended
        backend._start_runner(job_dir, backend._environment(spec, job_dir))
    assert_stays(
        lambda: (
            ledger.read_text() == "ran\n"
            and read_json(job_dir / "state.json")["state"] == "SUCCEEDED"
        ),
        1.0,
        "one run, SUCCEEDED, with late runners started",
    )


def test_a_job_starts_with_a_copy_of_the_checkpoints_it_is_given(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    earlier = backend.submit(
        JobSpec(name="earlier", command='echo 2 > "$PAI_OUTPUT_CHECKPOINTS/epoch"')
    )
    assert wait_for(backend, earlier).state is JobState.SUCCEEDED
    checkpoints = backend.outputs(earlier)["checkpoints"]  # a file:// URI
    command = 'cat "$PAI_OUTPUT_CHECKPOINTS/epoch"; echo 3 > "$PAI_OUTPUT_CHECKPOINTS/epoch"'
    later = backend.submit(JobSpec(name="later", command=command, checkpoints=checkpoints))
    assert wait_for(backend, later).state is JobState.SUCCEEDED
    assert read_all_logs(backend, later) == ["2"]
    assert (backend.job_dir("earlier") / "ml/output/checkpoints/epoch").read_text() == "2\n"


def memory_cgroup(name: str, limit: int) -> Path:
    """A memory cgroup of this test's own (cgroup v1's memory controller, or v2), limited to
    ``limit`` bytes; the test runs as root to make it."""
    v1 = Path("/sys/fs/cgroup/memory")
    group = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / name
    group.mkdir()
    limit_file = "memory.limit_in_bytes" if v1.is_dir() else "memory.max"
    (group / limit_file).write_text(str(limit))
    return group


def test_sigkill_says_out_of_memory_only_when_the_kernel_did_it(tmp_path: Path) -> None:
    """A job killed from outside is "killed by SIGKILL", nothing guessed; one the kernel's
    out-of-memory killer killed (it went past its cgroup's 64 MiB) says out of memory."""
    backend = make_backend(tmp_path)
    ledger = tmp_path / "pid"
    handle = backend.submit(JobSpec(name="killed", command=f"echo $$ > {ledger}; exec sleep 600"))
    pid = int(wait_until(lambda: ledger.exists() and ledger.read_text().strip(), 30, "a pid"))
    os.kill(pid, 9)
    killed = wait_for(backend, handle)
    assert killed.state is JobState.FAILED
    # (the kernel's other kills meanwhile, on a shared machine, would be named as such)
    assert killed.reason.startswith("command killed by SIGKILL"), killed.reason
    assert "out of memory" not in killed.reason

    group = memory_cgroup(f"paiexp-test-{os.getpid()}", 64 << 20)
    try:
        command = (
            f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -c 'x = b\"x\" * (512 << 20)'"
        )
        handle = backend.submit(JobSpec(name="oom", command=command))
        oom = wait_for(backend, handle)
    finally:
        group.rmdir()
    assert oom.state is JobState.FAILED
    assert oom.reason == (
        "command killed by SIGKILL: out of memory (the kernel's out-of-memory killer killed it)"
    )
