"""The detached runner of one local job: ``python local_runner.py JOB_DIR``.

It runs in its own session (the launcher may die; the job goes on), installs the job's
requirements, runs the command with ``sh -c`` in its own process group, enforces
``max_run_time``, turns SIGTERM into a graceful stop of the whole group, and records the
outcome in ``state.json`` atomically.  It is started by path and imports only the standard
library, so a job starts as fast as Python does; :mod:`paiexp.backends.local` shares its
file helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

RUNNING, SUCCEEDED, FAILED, STOPPED = "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never half."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Runner:
    def __init__(self, job_dir: Path, grace: float, install: str, cache_dir: Path) -> None:
        self.job_dir = job_dir
        self.grace = grace
        self.install = install
        self.cache_dir = cache_dir
        self.spec = read_json(job_dir / "spec.json")
        self.working_dir = job_dir / "ml" / "usercode"
        self.state: dict[str, Any] = {"state": RUNNING, "started_at": time.time()}
        self.child: subprocess.Popen[bytes] | None = None
        self.stop_reason: tuple[str, str] | None = None
        self.lock = threading.Lock()

    def write_state(self, **changes: Any) -> None:
        self.state.update(changes)
        write_json_atomic(self.job_dir / "state.json", self.state)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.terminate(STOPPED, "stopped"))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.write_state(runner_pid=os.getpid())
        if (self.job_dir / "stop").exists():
            self.write_state(
                state=STOPPED, reason="stopped before it started", ended_at=time.time()
            )
            return
        with (self.job_dir / "job.log").open("ab", buffering=0) as log:
            if not self.install_requirements(log):
                self.write_state(
                    state=FAILED,
                    ended_at=time.time(),
                    reason="installing the job's requirements failed (see log)",
                )
                return
            exit_code = self.run_command(log)
        self.finish(exit_code)

    def install_requirements(self, log: IO[bytes]) -> bool:
        """Install ``requirements`` and ``requirements.txt`` before the command, as PAI does.

        In ``auto`` mode a set of requirements already met is not handed to pip; the answer
        is cached until the interpreter's site-packages change.
        """
        files = [path for path in [self.working_dir / "requirements.txt"] if path.is_file()]
        lines = list(self.spec["requirements"])
        for path in files:
            lines += [line.strip() for line in path.read_text().splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        if not lines or self.install == "never":
            return True
        marker = self.cache_dir / f"requirements-met-{_environment_key(lines)}"
        if self.install == "auto" and (marker.exists() or all(map(_satisfied, lines))):
            log.write(f"[paiexp] requirements already satisfied: {', '.join(lines)}\n".encode())
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            marker.touch()
            return True
        command = [sys.executable, "-m", "pip", "install", *self.spec["requirements"]]
        for path in files:
            command += ["-r", str(path)]
        log.write(f"[paiexp] installing requirements: {' '.join(command[4:])}\n".encode())
        result = subprocess.run(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.working_dir,
            stdin=subprocess.DEVNULL,
        )
        return result.returncode == 0

    def run_command(self, log: IO[bytes]) -> int:
        with self.lock:
            if self.stop_reason is not None:
                return -signal.SIGTERM
            self.child = subprocess.Popen(
                ["/bin/sh", "-c", self.spec["command"]],
                cwd=self.working_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        self.write_state(pid=self.child.pid, pgid=self.child.pid)
        max_run_time = self.spec.get("max_run_time")
        if max_run_time:
            timer = threading.Timer(
                max_run_time, self.terminate, (FAILED, f"exceeded max_run_time of {max_run_time} s")
            )
            timer.daemon = True
            timer.start()
        return self.child.wait()

    def terminate(self, state: str, reason: str) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after the grace period."""
        with self.lock:
            if self.stop_reason is None:
                self.stop_reason = (state, reason)
            child = self.child
        if child is None:
            return
        kill_group(child.pid, signal.SIGTERM)
        killer = threading.Timer(self.grace, kill_group, (child.pid, signal.SIGKILL))
        killer.daemon = True
        killer.start()

    def finish(self, exit_code: int) -> None:
        if self.child is not None:
            kill_group(self.child.pid, signal.SIGKILL)  # leftovers die with the job, as on PAI
        self.persist_outputs()
        if self.stop_reason is not None:
            state, reason = self.stop_reason
        elif exit_code == 0:
            state, reason = SUCCEEDED, ""
        elif exit_code < 0:
            name = signal.Signals(-exit_code).name
            hint = " (out of memory?)" if name == "SIGKILL" else ""
            state, reason = FAILED, f"command killed by {name}{hint}"
        else:
            state, reason = FAILED, f"command exited with code {exit_code}"
        self.write_state(
            state=state, reason=reason or None, exit_code=exit_code, ended_at=time.time()
        )

    def persist_outputs(self) -> None:
        """Copy channels that name a local destination there, as PAI persists to their URI."""
        for channel, destination in self.spec["outputs"].items():
            if destination:
                source = self.job_dir / "ml" / "output" / channel
                shutil.copytree(source, destination, dirs_exist_ok=True)


def _environment_key(lines: list[str]) -> str:
    """Changes when the requirements, the interpreter or its installed packages change."""
    digest = hashlib.sha256("\n".join([sys.executable, *lines]).encode())
    for directory in [*site.getsitepackages(), site.getusersitepackages()]:
        with contextlib.suppress(OSError):
            digest.update(f"{directory}:{os.stat(directory).st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def _satisfied(line: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requirement = Requirement(line)
    except InvalidRequirement:
        return False  # options, URLs, editable installs: let pip decide
    if requirement.marker is not None and not requirement.marker.evaluate():
        return True
    try:
        installed = version(requirement.name)
    except PackageNotFoundError:
        return False
    return requirement.specifier.contains(installed, prereleases=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--install", default="auto")
    parser.add_argument("--cache-dir", type=Path, required=True)
    args = parser.parse_args()
    runner = Runner(args.job_dir, args.grace, args.install, args.cache_dir)
    try:
        runner.run()
    except Exception as exc:  # a broken runner must still leave a final state behind
        runner.write_state(
            state=FAILED, reason=f"paiexp runner error: {exc!r}", ended_at=time.time()
        )
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
