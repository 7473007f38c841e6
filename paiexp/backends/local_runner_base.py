"""What a local job's runner is made of: its states, the files it keeps, and :class:`Runner`,
which runs one job's command to its end (:mod:`paiexp.backends.local_runner` starts it; the
multi-instance :class:`~paiexp.backends.local_group.GroupRunner` extends it).

It runs in its own session (the launcher may die; the job goes on), enters a mount namespace
in which ``/ml`` is the job's own tree (:mod:`paiexp.backends.mlroot`; where the machine gives none,
a job that wrote under the host's ``/ml`` fails), installs the job's requirements, runs the
command with ``sh -c`` in its own process group, enforces
``max_run_time``, turns SIGTERM into a graceful stop of the whole group, and records the
outcome in ``state.json`` atomically.  Once the state holds the command's process group, it
changes only once more, as the runner exits: a launcher holding the runner's pidfd reads a
running job's state again only when the runner is gone.  Standard library only (it starts
for every job), with the standard-library-only :mod:`paiexp.util.jsonfiles`,
:mod:`paiexp.util.processes`, :mod:`paiexp.util.exits`, :mod:`paiexp.util.requirements` and
:mod:`paiexp.backends.mlroot`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time

from paiexp.backends import mlroot
from paiexp.util.diskfull import DISK_FULL_ERRNOS, nearly_full, says_disk_full
from paiexp.util.exits import failure_reason
from paiexp.util.jsonfiles import read_json, write_json_atomic
from paiexp.util.processes import kill_group, process_start_time
from paiexp.util.requirements import requirement_lines, satisfied

RUNNER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_runner.py")
"""The runner's entry, started by path: ``python -S RUNNER_SCRIPT ...``."""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

    from paiexp.backends.warm_start import WarmProcess

RUNNING, SUCCEEDED, FAILED, STOPPED = "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"
LOCK_FILE = "runner.lock"
NO_PRIVATE_ML = "no_private_ml"  # in the state: why the job sees the host's /ml
WARM = "warm"  # in the state: the command was forked by the sweep's warm interpreter
# In the state: the job failed for the platform's reason, not its own (retried in a sweep).
PLATFORM_FAILURE = "platform_failure"
STATUS_LOST = (
    "its warm interpreter died, and the job ended without telling its exit status "
    "(killed by a signal?): the platform's failure, not the job's"
)
FULL_DISK = "full_disk"  # in the state: the job failed because its directory's disk was full
DISK_FULL_RETRY = 1.0  # seconds between tries of a state write that found the disk full
DISK_FULL_PATIENCE = 24 * 3600.0  # seconds such a write is tried for, then the runner gives up
LOG_TAIL_BYTES = 8192  # of the job's log, read for a full disk's error message


class Runner:
    def __init__(
        self, job_dir: str, grace: float, install: str, cache_dir: str, warm: str | None = None
    ) -> None:
        self.job_dir = os.path.abspath(job_dir)
        self.warm = warm  # the address of the warm interpreter that may fork the command
        self.grace = grace
        self.install = install
        self.cache_dir = cache_dir
        self.spec = read_json(self.path("spec.json"))
        self.working_dir = self.path("ml", "usercode")
        self.state: dict[str, Any] = {"state": RUNNING, "started_at": time.time()}
        self.child: subprocess.Popen[bytes] | WarmProcess | None = None
        self.stop_reason: tuple[str, str] | None = None
        self.alarms: dict[str, float] = {}  # what to do -> when (monotonic)
        self.host_ml: mlroot.Snapshot | None = None  # without a private /ml: the host's
        self.disk_was_full = False  # a state write of this runner found the disk full
        self.command_started = 0.0  # time.monotonic() as the command started

    def path(self, *parts: str) -> str:
        return os.path.join(self.job_dir, *parts)

    def write_state(self, **changes: Any) -> None:
        """Record the state; on a full disk, try again until there is room (the job's
        outcome is kept for the launcher that runs once space is freed)."""
        self.state.update(changes)
        waited = 0.0
        while True:
            try:
                write_json_atomic(self.path("state.json"), self.state)
                return
            except OSError as exc:
                if exc.errno not in DISK_FULL_ERRNOS or waited >= DISK_FULL_PATIENCE:
                    raise
                self.disk_was_full = True
                time.sleep(DISK_FULL_RETRY)
                waited += DISK_FULL_RETRY

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.terminate(STOPPED, "stopped"))
        signal.signal(signal.SIGALRM, lambda *_: self.on_alarm())
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if not self.take_job():
            return
        me = os.getpid()
        self.write_state(runner_pid=me, runner_start=process_start_time(me))
        if os.path.exists(self.path("stop")):
            self.write_state(
                state=STOPPED, reason="stopped before it started", ended_at=time.time()
            )
            return
        self.enter_private_ml()
        with open(self.path("job.log"), "ab", buffering=0) as log:
            if not self.install_requirements(log):
                self.write_state(
                    state=FAILED,
                    ended_at=time.time(),
                    reason="installing the job's requirements failed (see log)",
                )
                return
            exit_code = self.run_command(log)
        self.finish(exit_code)

    def take_job(self) -> bool:
        """Whether this runner may run the job: one runner holds its lock, and a job whose
        state exists was started before (maybe by a runner since killed): never twice."""
        self.lock = os.open(self.path(LOCK_FILE), os.O_CREAT | os.O_RDWR)
        for _ in range(50):  # a launcher checking the lock holds it for an instant
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.01)
        else:
            return False  # another runner has the job
        return not os.path.exists(self.path("state.json"))

    def enter_private_ml(self) -> None:
        """From here on, ``/ml`` is the job's tree, and so are the ``PAI_*`` paths and the
        working directory, as on PAI.  Where the machine gives no private ``/ml``, the
        job's paths stay as they are, the reason goes into the state (the launcher says it
        once) and what the host's ``/ml`` holds is noted, to tell whether the job wrote there.
        """
        why = mlroot.enter(self.job_dir)
        if why is None:
            ml_dir = self.path("ml")
            mlroot.rebase_paths(os.environ, ml_dir)
            self.working_dir = mlroot.in_view(self.working_dir, ml_dir)
        else:
            self.state[NO_PRIVATE_ML] = why
            self.host_ml = mlroot.snapshot()

    def wrote_host_ml(self) -> bool:
        """Whether the job, running without a private ``/ml``, changed the host's."""
        return NO_PRIVATE_ML in self.state and mlroot.snapshot() != self.host_ml

    def install_requirements(self, log: IO[bytes]) -> bool:
        """Install ``requirements`` and ``requirements.txt`` before the command, as PAI does.

        In ``auto`` mode a set of requirements already met is not handed to pip; the answer
        is cached until the interpreter's site-packages change.
        """
        requirements_txt = os.path.join(self.working_dir, "requirements.txt")
        files = [requirements_txt] if os.path.isfile(requirements_txt) else []
        lines = requirement_lines(self.spec["requirements"], self.working_dir)
        if not lines or self.install == "never":
            return True
        marker = os.path.join(self.cache_dir, f"requirements-met-{_environment_key(lines)}")
        if self.install == "auto" and (os.path.exists(marker) or self.satisfied(lines)):
            log.write(f"[paiexp] requirements already satisfied: {', '.join(lines)}\n".encode())
            os.makedirs(self.cache_dir, exist_ok=True)
            open(marker, "a").close()
            return True
        command = [sys.executable, "-m", "pip", "install", *self.spec["requirements"]]
        for path in files:
            command += ["-r", path]
        log.write(f"[paiexp] installing requirements: {' '.join(command[4:])}\n".encode())
        result = subprocess.run(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.working_dir,
            stdin=subprocess.DEVNULL,
        )
        return result.returncode == 0

    @staticmethod
    def satisfied(lines: list[str]) -> bool:
        _site()  # packaging is in site-packages
        return all(map(satisfied, lines))

    def run_command(self, log: IO[bytes]) -> int:
        if self.stop_reason is not None:
            return -signal.SIGTERM
        self.command_started = time.monotonic()
        self.child = self.warm_start(log) or subprocess.Popen(
            ["/bin/sh", "-c", self.spec["command"]],
            cwd=self.working_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        forked = not isinstance(self.child, subprocess.Popen)
        self.write_state(
            pid=self.child.pid, pgid=self.child.pid, **({WARM: True} if forked else {})
        )
        if self.stop_reason is not None:  # a stop arrived while the command started
            self.terminate(*self.stop_reason)
        max_run_time = self.spec.get("max_run_time")
        if max_run_time:
            self.schedule("max_run_time", max_run_time)
        exit_code = self.child.wait()
        if exit_code is None:  # forked, and its exit status lost with the warm interpreter
            return -signal.SIGKILL
        if self.stop_reason is None and not isinstance(self.child, subprocess.Popen):
            return self.child.as_sh_reports(exit_code)  # forked: no sh reported its end
        return exit_code

    def warm_start(self, log: IO[bytes]) -> WarmProcess | None:
        """The command forked by the warm interpreter, if it runs a Python script that one
        can fork (its own session and process group, like the command's)."""
        if self.warm is None:
            return None
        from paiexp.backends import warm_start

        env = dict(os.environ)
        return warm_start.start(
            self.warm, self.spec["command"], env, self.working_dir, log.fileno()
        )

    def schedule(self, what: str, seconds: float) -> None:
        self.alarms[what] = time.monotonic() + seconds
        self.arm()

    def arm(self) -> None:
        if self.alarms:
            wait = max(0.001, min(self.alarms.values()) - time.monotonic())
            signal.setitimer(signal.ITIMER_REAL, wait)

    def on_alarm(self) -> None:
        now = time.monotonic()
        due = [what for what, when in self.alarms.items() if when <= now]
        for what in due:
            del self.alarms[what]
            if what == "max_run_time":
                seconds = self.spec["max_run_time"]
                self.terminate(FAILED, f"exceeded max_run_time of {seconds} s")
            elif what == "kill" and self.child is not None:
                kill_group(self.child.pid, signal.SIGKILL)
        self.arm()

    def terminate(self, state: str, reason: str) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after the grace period."""
        if self.stop_reason is None:
            self.stop_reason = (state, reason)
        if self.child is None:
            return
        kill_group(self.child.pid, signal.SIGTERM)
        self.schedule("kill", self.grace)

    def finish(self, exit_code: int) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self.child is not None:
            kill_group(self.child.pid, signal.SIGKILL)  # leftovers die with the job, as on PAI
        unpersisted = self.persist_outputs()
        if self.stop_reason is not None:
            state, reason = self.stop_reason
        elif self.status_lost():
            state, reason = FAILED, STATUS_LOST
            self.state[PLATFORM_FAILURE] = True
        elif exit_code == 0:
            state, reason = SUCCEEDED, ""
        else:
            state, reason = FAILED, failure_reason(exit_code, sigkill_hint=self.sigkill_hint())
        if state != STOPPED and unpersisted:
            state, reason = FAILED, f"{unpersisted}; {reason}" if reason else unpersisted
        if state != STOPPED and self.wrote_host_ml():  # its outputs are lost: never SUCCEEDED
            lost = (
                "the job wrote under the host's /ml (this machine gives local jobs no private "
                f"/ml: {self.state[NO_PRIVATE_ML]}); use backend=docker"
            )
            state, reason = FAILED, f"{lost}; {reason}" if reason else lost
        if state == FAILED and self.found_disk_full():
            reason = f"no space left on device in the job's directory {self.job_dir}; {reason}"
            self.state[FULL_DISK] = self.job_dir
        self.write_state(
            state=state, reason=reason or None, exit_code=exit_code, ended_at=time.time()
        )

    def status_lost(self) -> bool:
        """Whether the command was forked warm and its exit status died with the warm
        interpreter (the job ended without telling it)."""
        return getattr(self.child, "status_lost", False)

    def sigkill_hint(self) -> str:
        """What the kernel's log says of a SIGKILL's cause (its out-of-memory killer)."""
        from paiexp.util.oom import sigkill_reason

        assert self.child is not None
        return sigkill_reason(self.child.pid, self.command_started)

    def found_disk_full(self) -> bool:
        """Whether the job's disk was full as it failed: a state write found it so, the job's
        log says so, or its file system has (next to) no room left."""
        if self.disk_was_full or nearly_full(self.job_dir):
            return True
        try:
            with open(self.path("job.log"), "rb") as log:
                log.seek(max(0, os.fstat(log.fileno()).st_size - LOG_TAIL_BYTES))
                tail = log.read().decode("utf-8", errors="replace")
        except OSError:
            return False
        return says_disk_full(tail.splitlines())

    def persist_outputs(self) -> str | None:
        """Copy channels that name a local destination there, as PAI persists to their URI;
        why one could not be, or None."""
        if not any(self.spec["outputs"].values()):
            return None
        from pathlib import Path

        from paiexp.util.confine import persist_outputs

        output_dir = Path(self.path("ml", "output"))
        return persist_outputs(self.spec["outputs"], lambda channel: output_dir / channel)


def _environment_key(lines: list[str]) -> str:
    """Changes when the requirements, the interpreter or its installed packages change."""
    import hashlib
    import site  # its directories only: site-packages need not be on the path for this

    digest = hashlib.sha256("\n".join([sys.executable, *lines]).encode())
    for directory in [*site.getsitepackages(), site.getusersitepackages()]:
        with contextlib.suppress(OSError):
            digest.update(f"{directory}:{os.stat(directory).st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def _site() -> Any:
    """The ``site`` module, with site-packages on sys.path (the runner starts with -S)."""
    import site

    if sys.flags.no_site and not getattr(_site, "done", False):
        site.main()
        _site.done = True  # type: ignore[attr-defined]
    return site
