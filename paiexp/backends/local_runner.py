"""The detached runner of one local job: ``python -m paiexp.backends.local_runner JOB_DIR``.

It runs in its own session (the launcher may die; the job goes on), installs the job's
requirements, runs the command with ``sh -c`` in its own process group, enforces
``max_run_time``, turns SIGTERM into a graceful stop of the whole group, and records the
outcome in ``state.json`` atomically.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from paiexp import contract
from paiexp.backends.base import JobState
from paiexp.backends.local import kill_group, read_json, write_json_atomic
from paiexp.spec import JobSpec


class Runner:
    def __init__(self, job_dir: Path, grace: float, install: str) -> None:
        self.job_dir = job_dir
        self.grace = grace
        self.install = install
        self.spec = JobSpec.from_dict(read_json(job_dir / "spec.json"))
        self.layout = contract.JobLayout(job_dir / "ml")
        self.state: dict[str, Any] = {"state": JobState.RUNNING.value, "started_at": time.time()}
        self.child: subprocess.Popen[bytes] | None = None
        self.stop_reason: tuple[JobState, str] | None = None
        self.lock = threading.Lock()

    def write_state(self, **changes: Any) -> None:
        self.state.update(changes)
        write_json_atomic(self.job_dir / "state.json", self.state)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.terminate(JobState.STOPPED, "stopped"))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.write_state(runner_pid=os.getpid())
        if (self.job_dir / "stop").exists():
            self.write_state(
                state=JobState.STOPPED.value,
                reason="stopped before it started",
                ended_at=time.time(),
            )
            return 0
        with (self.job_dir / "job.log").open("ab", buffering=0) as log:
            if not self.install_requirements(log):
                self.write_state(
                    state=JobState.FAILED.value,
                    ended_at=time.time(),
                    reason="installing the job's requirements failed (see log)",
                )
                return 0
            exit_code = self.run_command(log)
        self.finish(exit_code)
        return 0

    def install_requirements(self, log: IO[bytes]) -> bool:
        files = [Path(self.layout.working_dir) / "requirements.txt"]
        files = [path for path in files if path.is_file()]
        lines = list(self.spec.requirements)
        for path in files:
            lines += [line.strip() for line in path.read_text().splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        if not lines or self.install == "never":
            return True
        if self.install == "auto" and all(_satisfied(line) for line in lines):
            log.write(
                b"[paiexp] requirements already satisfied: " + ", ".join(lines).encode() + b"\n"
            )
            return True
        command = [sys.executable, "-m", "pip", "install", *self.spec.requirements]
        for path in files:
            command += ["-r", str(path)]
        log.write(f"[paiexp] installing requirements: {' '.join(command[4:])}\n".encode())
        result = subprocess.run(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.layout.working_dir,
            stdin=subprocess.DEVNULL,
        )
        return result.returncode == 0

    def run_command(self, log: IO[bytes]) -> int:
        with self.lock:
            if self.stop_reason is not None:
                return -signal.SIGTERM
            self.child = subprocess.Popen(
                ["/bin/sh", "-c", self.spec.command],
                cwd=self.layout.working_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        self.write_state(pid=self.child.pid, pgid=self.child.pid)
        if self.spec.max_run_time:
            timer = threading.Timer(
                self.spec.max_run_time,
                self.terminate,
                (JobState.FAILED, f"exceeded max_run_time of {self.spec.max_run_time} s"),
            )
            timer.daemon = True
            timer.start()
        return self.child.wait()

    def terminate(self, state: JobState, reason: str) -> None:
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
            state, reason = JobState.SUCCEEDED, ""
        elif exit_code < 0:
            name = signal.Signals(-exit_code).name
            hint = " (out of memory?)" if name == "SIGKILL" else ""
            state, reason = JobState.FAILED, f"command killed by {name}{hint}"
        else:
            state, reason = JobState.FAILED, f"command exited with code {exit_code}"
        self.write_state(
            state=state.value, reason=reason or None, exit_code=exit_code, ended_at=time.time()
        )

    def persist_outputs(self) -> None:
        """Copy channels that name a local destination there, as PAI persists to their URI."""
        for channel, destination in self.spec.outputs.items():
            if destination:
                shutil.copytree(self.layout.output_dir(channel), destination, dirs_exist_ok=True)


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
    args = parser.parse_args()
    return Runner(args.job_dir, args.grace, args.install).run()


if __name__ == "__main__":
    sys.exit(main())
