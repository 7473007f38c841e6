"""Warm starts on backend=local: a sweep's ``python SCRIPT`` jobs are forked from a warm
interpreter, and the job cannot tell.

Each test runs real jobs through a real local backend: a probe script reports what it sees as
one JSON line, run warm (a sweep's backend: ``set_concurrency``) and cold (``warm_start:
false``), and the two reports must be the same, bar the one field that says how it started.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import socket
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import job_end, wait_until
from test_contract_probe import HYPERPARAMETERS, assert_contract_seen, write_probe_project

from paiexp.backends import JobState, JobStatus, warm_start
from paiexp.backends.local import LocalBackend
from paiexp.backends.threads import cpu_share
from paiexp.config.schema import LocalBackendConfig
from paiexp.config.spec import JobSpec
from paiexp.util.processes import process_alive

# What a job sees, as one JSON line; then it ends as PROBE_END says.
PROBE = textwrap.dedent(
    """
    import json, os, random, signal, sys
    warm = "paiexp.backends.warm" in sys.modules  # the one thing that differs
    import numpy

    def tree(root):
        found = []
        for directory, _, files in os.walk(root):
            found += [os.path.join(directory, name) for name in [".", *files]]
        return sorted(found)

    seen = {
        "warm": warm,
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "name": __name__,
        "file": __file__,
        "path0": sys.path[0],
        "executable": sys.executable,
        "environment": dict(os.environ),
        "cwd": os.getcwd(),
        "ml": tree("/ml"),
        "ml_is_a_mount": os.path.ismount("/ml"),
        "own_group": os.getpgid(0) in (os.getpid(), os.getppid()),  # cold: sh leads it
        "own_session": os.getsid(0) == os.getpgid(0),
        "stdin": os.readlink("/proc/self/fd/0"),
        "stdout_is_stderr": os.path.sameopenfile(1, 2),
        "signals": {
            name: str(signal.getsignal(getattr(signal, name)))
            for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", "SIGCHLD", "SIGUSR1")
        },
        "random": random.random(),
        "numpy_random": float(numpy.random.rand()),
    }
    print(json.dumps(seen), flush=True)

    # How it exits: other threads are waited for, then atexit runs (a file: not the log).
    import atexit, concurrent.futures, threading
    def note(line):
        with open("exits.txt", "a") as stream:
            stream.write(line + "\\n")
    last = threading.Event()
    def late_thread():
        last.wait()
        note("thread done")
    threading.Thread(target=late_thread).start()
    try:
        pool = concurrent.futures.ThreadPoolExecutor(1)  # an idle worker, joined as Python does
        pool.submit(note, "pool job done").result()
        atexit.register(note, "atexit ran")
    finally:
        last.set()

    end = os.environ.get("PROBE_END", "")
    if end == "exit3":
        sys.exit(3)
    if end == "exit_message":
        sys.exit("the probe says bye")
    if end == "raise":
        raise RuntimeError("the probe failed on purpose")
    if end == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    """
)
# How the job started, and what differs by job or by draw: every other field must be equal.
DIFFERS = ("warm", "random", "numpy_random")


def make_backend(
    tmp_path: Path, *, warm: bool = True, jobs: int = 2, **config: Any
) -> LocalBackend:
    backend = LocalBackend(
        LocalBackendConfig(root=str(tmp_path / "jobs"), warm_start=warm, **config), tmp_path
    )
    backend.set_concurrency(jobs)  # as a sweep does: standby runners, warm interpreters
    return backend


def code_dir(tmp_path: Path, script: str = PROBE, name: str = "probe.py") -> Path:
    directory = tmp_path / "code"
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(script)
    return directory


def run(backend: LocalBackend, spec: JobSpec) -> tuple[JobStatus, list[str]]:
    handle = backend.submit(spec)
    status = job_end(backend, handle)
    return status, backend.read_logs(handle, 0, final=True).lines


def probe_spec(code: Path, name: str = "probe", end: str = "") -> JobSpec:
    return JobSpec(
        name=name,
        command="python probe.py --seed 7 $PAI_USER_ARGS 'two words' *.py",
        source_dir=str(code),
        hyperparameters={"epochs": "10", "note": "it's quoted"},
        environments={
            "PROBE_END": end,
            "PROBE_CUSTOM": "custom value",
        },
    )


def seen(lines: list[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(lines[0])
    return report


def warm_and_cold(tmp_path: Path, end: str) -> tuple[tuple[JobStatus, list[str]], ...]:
    code = code_dir(tmp_path)
    warm = run(make_backend(tmp_path / "warm"), probe_spec(code, end=end))
    cold = run(make_backend(tmp_path / "cold", warm=False), probe_spec(code, end=end))
    assert seen(warm[1])["warm"] and not seen(cold[1])["warm"]
    return warm, cold


def test_a_probe_sees_the_same_process_warm_and_cold(tmp_path: Path) -> None:
    (warm_status, warm_log), (cold_status, cold_log) = warm_and_cold(tmp_path, "")
    assert warm_status.state is cold_status.state is JobState.SUCCEEDED
    warm, cold = seen(warm_log), seen(cold_log)
    for field in DIFFERS:
        del warm[field], cold[field]
    assert {k: v for k, v in warm["environment"].items() if cold["environment"].get(k) != v} == {}
    assert {k: v for k, v in cold["environment"].items() if warm["environment"].get(k) != v} == {}
    assert warm == cold
    assert cold["argv"][:5] == ["probe.py", "--seed", "7", "--epochs", "10"]
    assert cold["argv"][-2:] == ["two words", "probe.py"]  # quotes removed, globs expanded
    assert cold["name"] == "__main__" and cold["file"] == "/ml/usercode/probe.py"
    assert cold["path0"] == cold["cwd"] == "/ml/usercode"
    assert (
        cold["ml_is_a_mount"]
        and cold["own_group"]
        and not cold["own_session"]
        and cold["stdout_is_stderr"]
    )
    assert cold["environment"]["PROBE_CUSTOM"] == "custom value"


@pytest.mark.parametrize(
    ("end", "exit_code"),
    [("", 0), ("exit3", 3), ("exit_message", 1), ("raise", 1), ("sigterm", 128 + signal.SIGTERM)],
)
def test_a_warm_job_ends_as_a_cold_one(tmp_path: Path, end: str, exit_code: int) -> None:
    (warm_status, warm_log), (cold_status, cold_log) = warm_and_cold(tmp_path, end)
    assert warm_status.state is cold_status.state
    assert warm_status.state is (JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED)
    assert warm_status.exit_code == cold_status.exit_code == exit_code
    assert warm_status.reason == cold_status.reason
    assert warm_log[1:] == cold_log[1:]  # a traceback from the script's own frame down
    exits = {
        mode: (tmp_path / mode / "jobs" / "probe" / "ml" / "usercode" / "exits.txt")
        .read_text()
        .splitlines()
        for mode in ("warm", "cold")
    }
    assert exits["warm"] == exits["cold"]
    killed = end == "sigterm"  # a signal ends it where it is
    assert exits["cold"] == ["pool job done", *([] if killed else ["thread done", "atexit ran"])]
    if end == "exit_message":
        assert cold_log[-1] == "the probe says bye"
    if end == "raise":
        assert cold_log[1] == "Traceback (most recent call last):"
        assert cold_log[-1] == "RuntimeError: the probe failed on purpose"


def test_warm_jobs_draw_their_own_random_numbers(tmp_path: Path) -> None:
    backend = make_backend(tmp_path)
    code = code_dir(tmp_path)
    first = seen(run(backend, probe_spec(code, "first"))[1])
    second = seen(run(backend, probe_spec(code, "second"))[1])
    assert first["warm"] and second["warm"]
    assert first["random"] != second["random"]
    assert first["numpy_random"] != second["numpy_random"]


def test_a_stopped_warm_job_takes_its_children_with_it(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        warm = "paiexp.backends.warm" in sys.modules
        child = subprocess.Popen(["sleep", "600"])
        print(f"child={child.pid} warm={warm}", flush=True)
        time.sleep(600)
        """
    )
    backend = make_backend(tmp_path)
    spec = JobSpec(
        name="parent",
        command="python parent.py",
        source_dir=str(code_dir(tmp_path, script, "parent.py")),
    )
    handle = backend.submit(spec)

    def child_started() -> list[str]:
        return backend.read_logs(handle, 0).lines

    line = wait_until(child_started, 60, "the job to start its child")[0]
    pid, warm = line.split()
    assert warm == "warm=True"
    child = int(pid.removeprefix("child="))
    assert process_alive(child, None)
    backend.stop(handle)
    assert job_end(backend, handle).state is JobState.STOPPED
    wait_until(lambda: not process_alive(child, None), 30, "the job's child to be stopped")


THREADS = textwrap.dedent(
    """
    import json, sys
    warm = "paiexp.backends.warm" in sys.modules
    import numpy, xgboost
    from threadpoolctl import threadpool_info
    pools = {pool["user_api"]: pool["num_threads"] for pool in threadpool_info()}
    print(json.dumps({"warm": warm, "pools": pools}), flush=True)
    """
)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_warm_job_runs_its_share_of_threads(tmp_path: Path, jobs: int) -> None:
    pytest.importorskip("threadpoolctl")
    backend = make_backend(tmp_path, jobs=jobs)
    spec = JobSpec(
        name="threads",
        command="python threads.py",
        source_dir=str(code_dir(tmp_path, THREADS, "threads.py")),
    )
    status, lines = run(backend, spec)
    assert status.state is JobState.SUCCEEDED, lines
    report = seen(lines)
    share = cpu_share(len(os.sched_getaffinity(0)), jobs)
    assert report["warm"]
    assert report["pools"] == {"blas": share, "openmp": share}


def test_the_pai_contract_probe_sees_the_contract_warm(tmp_path: Path) -> None:
    """The contract suite's own probe, run warm, sees exactly what it sees cold."""
    (tmp_path / "conf" / "job").mkdir(parents=True)
    write_probe_project(tmp_path)
    project = tmp_path
    spec = JobSpec(
        name="contract",
        command="python probe.py $PAI_USER_ARGS",
        source_dir=str(project / "probe"),
        hyperparameters={
            "epochs": "10",
            "batch-size": "32",
            "train.learning_rate": "0.001",
            "note": HYPERPARAMETERS["note"],
            "flag": "true",
        },
        inputs={
            "train": str(project / "data" / "single.csv"),
            "shards": str(project / "data" / "dir"),
        },
        outputs={"extra": None},
        environments={"PROBE_CUSTOM": "custom value"},
    )
    backend = make_backend(tmp_path)
    status, lines = run(backend, spec)
    assert status.state is JobState.SUCCEEDED, lines
    report = json.loads(
        (backend.job_dir("contract") / "ml" / "output" / "model" / "seen.json").read_text()
    )
    assert_contract_seen(report, Path("/ml"))


@pytest.mark.parametrize(
    ("case", "command", "script", "config"),
    [
        ("shell", "python probe.py; echo after", PROBE, {}),
        ("off", "python probe.py", PROBE, {}),
        ("import fails", "python probe.py", PROBE, {"warm_imports": ["no_such_module_here"]}),
        ("other interpreter", "/usr/bin/env python3 probe.py", PROBE, {}),
    ],
)
def test_what_cannot_start_warm_runs_as_before(
    tmp_path: Path, case: str, command: str, script: str, config: dict[str, Any]
) -> None:
    backend = make_backend(tmp_path, warm=case != "off", **config)
    spec = JobSpec(name="cold", command=command, source_dir=str(code_dir(tmp_path, script)))
    status, lines = run(backend, spec)
    assert status.state is JobState.SUCCEEDED, lines
    assert not seen(lines)["warm"]
    if case == "shell":
        assert lines[-1] == "after"


def test_every_instance_of_a_multi_instance_job_starts_warm(tmp_path: Path) -> None:
    """Each instance is forked from a warm interpreter as a one-instance job is, sees what a
    cold instance sees (its own rank), and draws its own random numbers."""
    code = code_dir(tmp_path)
    reports = {}
    for mode in ("warm", "cold"):
        backend = make_backend(tmp_path / mode, warm=mode == "warm")
        spec = dataclasses.replace(probe_spec(code), instance_count=2)
        handle = backend.submit(spec)
        assert job_end(backend, handle).state is JobState.SUCCEEDED
        logs = backend.instance_logs(handle)
        assert sorted(logs) == ["master-0", "worker-0"]
        reports[mode] = {
            name: json.loads(path.read_text().splitlines()[0]) for name, path in logs.items()
        }
    warm, cold = reports["warm"], reports["cold"]
    assert all(r["warm"] for r in warm.values()) and not any(r["warm"] for r in cold.values())
    assert warm["master-0"]["random"] != warm["worker-0"]["random"]
    assert warm["master-0"]["numpy_random"] != warm["worker-0"]["numpy_random"]
    for name, rank in (("master-0", "0"), ("worker-0", "1")):
        for field in DIFFERS:
            del warm[name][field], cold[name][field]
        for report in (warm[name], cold[name]):
            assert report["environment"]["RANK"] == rank
            del report["environment"]["MASTER_PORT"]  # a free port, each job its own
        assert warm[name] == cold[name]


def test_a_warm_interpreter_that_dies_with_the_order_unread_forks_nothing(tmp_path: Path) -> None:
    """The warm interpreter is gone as a runner asks it for a fork (its launcher was
    SIGKILLed): it closes the connection with the order unread, the runner's read is reset,
    and the job starts cold (None here) instead of failing with the reset."""
    (tmp_path / "train.py").write_text("print('trained')\n")
    address = f"paiexp-test-warm-{os.getpid()}-{id(tmp_path)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(1)
    closed = threading.Event()

    def die_unread() -> None:
        connection, _ = listener.accept()
        # the order has arrived and is unread when it dies: the premise of the reset
        select.select([connection], [], [], 30)
        connection.close()
        closed.set()

    dying = threading.Thread(target=die_unread)
    dying.start()
    log = os.open(tmp_path / "job.log", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
        started = warm_start.start(address, "python train.py", env, str(tmp_path), log)
    finally:
        os.close(log)
        dying.join(30)
        listener.close()
    assert closed.is_set(), "the warm interpreter never closed the connection"
    assert started is None
