"""The local process backend against real processes: detached jobs, logs, stop, limits."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from paiexp.backends import JobHandle, JobState, JobStatus
from paiexp.backends.local import LocalBackend
from paiexp.config import LocalBackendConfig
from paiexp.errors import UserError
from paiexp.jsonfiles import read_json
from paiexp.processes import process_alive
from paiexp.spec import JobSpec


def make_backend(tmp_path: Path, **options: object) -> LocalBackend:
    return LocalBackend(LocalBackendConfig(root=str(tmp_path / "jobs"), **options), tmp_path)


def wait_for(backend: LocalBackend, handle: JobHandle, timeout: float = 60) -> JobStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = backend.poll([handle])[handle.id]
        if status.state.terminal:
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {handle.name} did not finish in {timeout} s")


def read_all_logs(backend: LocalBackend, handle: JobHandle) -> list[str]:
    return backend.read_logs(handle, 0, final=True).lines


def pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_job_runs_detached_and_logs_are_read_from_a_cursor(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    spec = JobSpec(name="logs", command="echo one; echo two; sleep 0.3; printf 'three'")
    handle = backend.submit(spec)
    status = wait_for(backend, handle)
    assert status.state is JobState.SUCCEEDED and status.exit_code == 0
    first = backend.read_logs(handle, 0)
    assert first.lines == ["one", "two"]  # the unterminated "three" waits for final=True
    rest = backend.read_logs(handle, first.cursor, final=True)
    assert rest.lines == ["three"]
    assert backend.read_logs(handle, rest.cursor, final=True).lines == []
    state = read_json(backend.job_dir("logs") / "state.json")
    assert state["ended_at"] >= state["started_at"]
    assert os.getsid(os.getpid()) != state["runner_pid"]  # the runner leads its own session


def test_submit_is_idempotent_by_name(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    backend = make_backend(tmp_path)
    spec = JobSpec(name="once", command=f"echo ran >> {ledger}")
    first = backend.submit(spec)
    second = backend.submit(spec)
    assert first == second == backend.find("once")
    wait_for(backend, first)
    assert backend.submit(spec) == first
    time.sleep(0.3)
    assert ledger.read_text() == "ran\n"
    assert backend.find("never-submitted") is None


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
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert not pid_gone(grandchild)
    backend.stop(handle)
    status = wait_for(backend, handle, timeout=30)
    assert status.state is JobState.STOPPED
    deadline = time.monotonic() + 5
    while not pid_gone(grandchild):
        assert time.monotonic() < deadline, "the job's background process survived stop"
        time.sleep(0.05)


def test_stop_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, stop_grace_period=0.5)
    command = "trap '' TERM; echo ready; while true; do sleep 0.1; done"
    handle = backend.submit(JobSpec(name="stubborn", command=command))
    while "ready" not in read_all_logs(backend, handle):
        time.sleep(0.05)
    started = time.monotonic()
    backend.stop(handle)
    status = wait_for(backend, handle, timeout=30)
    assert status.state is JobState.STOPPED
    assert time.monotonic() - started < 10


def test_max_run_time_is_enforced(tmp_path: Path) -> None:
    backend = make_backend(tmp_path, stop_grace_period=1.0)
    handle = backend.submit(JobSpec(name="slow", command="sleep 60", max_run_time=1))
    status = wait_for(backend, handle, timeout=30)
    assert status.state is JobState.FAILED
    assert status.reason == "exceeded max_run_time of 1 s"
    assert status.ended_at - status.started_at < 10


def test_killed_runner_is_reported_as_failed(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    handle = backend.submit(JobSpec(name="orphan", command="echo up; sleep 60"))
    while "up" not in read_all_logs(backend, handle):
        time.sleep(0.05)
    launch = read_json(backend.job_dir("orphan") / "state.json")
    os.kill(launch["runner_pid"], 9)
    deadline = time.monotonic() + 10
    while process_alive(launch["runner_pid"], launch["runner_start"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status = backend.poll([handle])[handle.id]
    assert status.state is JobState.FAILED and "runner" in (status.reason or "")
    backend.stop(handle)  # kills the orphaned command's group
    pgid = read_json(backend.job_dir("orphan") / "state.json")["pgid"]
    deadline = time.monotonic() + 5
    while not pid_gone(pgid):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_outputs_output_parameters_and_local_destinations(tmp_path: Path) -> None:
    destination = tmp_path / "exported-model"
    backend = make_backend(tmp_path)
    command = (
        'echo weights > "$PAI_OUTPUT_MODEL/model.bin"; '
        'echo 0.75 > "$PAI_WORKING_DIR/../output/output_parameters/auc"; '
        'echo hello > "$PAI_OUTPUT_EXTRA/x.txt"'
    )
    spec = JobSpec(
        name="outs",
        command=command,
        outputs={"model": str(destination), "extra": None},
    )
    handle = backend.submit(spec)
    assert wait_for(backend, handle).state is JobState.SUCCEEDED
    outputs = backend.outputs(handle)
    assert set(outputs) == {"model", "checkpoints", "tensorboard", "extra"}
    assert outputs["model"] == destination.as_uri()
    assert (destination / "model.bin").read_text() == "weights\n"
    extra = Path(outputs["extra"].removeprefix("file://"))
    assert (extra / "x.txt").read_text() == "hello\n"
    assert backend.output_parameters(handle) == {"auc": 0.75}
    assert backend.console_url(handle) is None


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


def test_validate_rejects_what_the_local_backend_cannot_run(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    with pytest.raises(UserError, match=r"job\.inputs\.train: backend=local"):
        backend.validate(JobSpec(name="x", command="true", inputs={"train": "oss://bkt/a.csv"}))
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
    time.sleep(1.0)
    assert ledger.read_text() == "ran\n"
    assert read_json(job_dir / "state.json")["state"] == "SUCCEEDED"
