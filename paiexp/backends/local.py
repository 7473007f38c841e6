"""Local process backend: each job in its own directory that holds PAI's ``/ml`` tree.

A job runs under a small detached runner (:mod:`paiexp.backends.local_runner`) in its own
session, so it survives the launcher, and in a mount namespace in which ``/ml`` is its
directory's ``ml`` tree (:mod:`paiexp.backends.mlroot`); the runner records the job's state in
``state.json`` (written atomically) and the job's output goes to ``job.log``.  Layout of a
job directory::

    <root>/<job name>/spec.json      the JobSpec
                      runner.lock    held by the job's one runner for as long as it lives
                      state.json     state, pids, start, end, exit code, reason (by the runner)
                      job.log        stdout and stderr of the command
                      ml/usercode, ml/input/config, ml/input/data/<ch>, ml/output/<ch>

A job of ``instance_count`` > 1 runs as that many cooperating instances on this machine, each
with its own runner and ``/ml``, the master on the loopback: its directory holds theirs too
(:mod:`paiexp.backends.local_instances`), and its runner is theirs
(:mod:`paiexp.backends.local_group`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paiexp.backends import local_instances, local_runner
from paiexp.backends.base import JobHandle, JobState, JobStatus, LogChunk
from paiexp.backends.checks import (
    check_local_job,
    check_process_settings,
    check_root,
    oss_channels,
)
from paiexp.backends.jobdir import JobDirectories, LocalResults, read_log_file
from paiexp.backends.local_runner_base import FULL_DISK, LOCK_FILE, NO_PRIVATE_ML, PLATFORM_FAILURE
from paiexp.backends.threads import cpu_share, thread_environment
from paiexp.backends.warm_pool import WarmInterpreters
from paiexp.config.spec import JobSpec
from paiexp.contract import job_mlflow
from paiexp.contract import layout as contract
from paiexp.errors import UserError
from paiexp.util.jsonfiles import read_json
from paiexp.util.processes import kill_group, lock_held, process_alive

log = logging.getLogger(__name__)

STANDBY_REPLY_TIMEOUT = 10.0  # seconds the runner on standby has to fork a job's runner
STATE_FILE = "state.json"
StatKey = tuple[int, int, int]  # a file's inode, mtime (ns) and size
_told_no_private_ml = False  # that local jobs here see the host's /ml (said once)


class LocalBackend(LocalResults):
    name = "local"

    def __init__(self, config: Any, base_dir: Path) -> None:
        self.install_requirements = check_process_settings(config)
        self.root = check_root(config.root, base_dir)
        self._root = str(self.root)
        self.jobs = JobDirectories(self.root)
        self.poll_interval = float(config.poll_interval)
        self.stop_grace_period = float(config.stop_grace_period)
        self.threads_per_job = len(os.sched_getaffinity(0))
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # runners we spawned
        self._started: dict[str, tuple[int, str | None]] = {}  # job -> its runner (pid, start)
        self._pidfds: dict[str, tuple[int, int]] = {}  # job -> (pidfd, pid) of its runner
        self._states: dict[str, StateFile] = {}  # job -> its state as last read
        self._standby = StandbyRunner()  # kept only for sweeps (set_concurrency)
        weakref.finalize(self, self._standby.dismiss)
        self.warm_start = bool(config.warm_start)
        self._warm: WarmInterpreters | None = None  # a sweep's, with warm_start
        self._warm_imports = list(config.warm_imports)

    def job_dir(self, name: str) -> Path:
        return self.jobs.path(name)

    def validate(self, spec: JobSpec) -> None:
        for channel, uri in oss_channels(spec.inputs).items():
            raise UserError(
                f"job.inputs.{channel}: backend=local reads local paths only, got {uri!r}; "
                "use a local copy of the data"
            )
        check_local_job(spec, self.name)
        local_instances.check_instance_count(spec, self.name)

    def set_concurrency(self, jobs: int) -> None:
        """Concurrent jobs share this machine: each gets an equal share of its CPUs as threads.

        Without this, N OpenMP jobs (XGBoost, BLAS) each start one thread per core and slow
        each other down several times over.
        """
        self.threads_per_job = cpu_share(len(os.sched_getaffinity(0)), jobs)
        # A sweep: keep a runner ready to fork the runners of its next jobs.
        self._standby.keep(warm=self.warm_start)
        # And fork its Python jobs from interpreters that imported their modules once.
        if self.warm_start and self._warm is None:
            self._warm = WarmInterpreters(self._warm_imports)
            weakref.finalize(self, self._warm.dismiss)

    # -- submit / find ---------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobHandle:
        job_dir = self.job_dir(spec.name)
        if not self.jobs.exists(spec.name):
            self.jobs.create(spec, lambda staging: self._add_files(spec, staging))
        self._launch_once(spec, job_dir)
        return JobHandle(name=spec.name, id=spec.name)

    def _add_files(self, spec: JobSpec, staging: Path) -> None:
        """The job's inputs, and its instances' directories if it has several."""
        _link_inputs(spec, staging)
        if spec.instance_count > 1:
            job_dir = self.job_dir(spec.name)
            local_instances.lay_out_instances(spec, staging, job_dir, _link_inputs)

    def _launch_once(self, spec: JobSpec, job_dir: Path) -> None:
        """Start the job's runner unless one runs it or ran it already.

        Launchers racing here (or one that died after starting a runner) may start a second
        runner: the runner itself makes sure only one ever runs the job (its lock and state).
        """
        if (job_dir / STATE_FILE).exists() or lock_held(job_dir / LOCK_FILE):
            return
        env = self._environment(spec, job_dir)
        self._start_runner(job_dir, env, self._warm_address(spec, job_dir, env))

    def find(self, name: str) -> JobHandle | None:
        return JobHandle(name=name, id=name) if self.jobs.exists(name) else None

    def _environment(self, spec: JobSpec, job_dir: Path) -> dict[str, str]:
        """The environment of the job's command: the launcher's, the job's, the contract's
        (paths in the job directory; the runner points them at ``/ml`` in the job's view)."""
        input_files = {
            channel: None if Path(source).is_dir() else Path(source).name
            for channel, source in spec.inputs.items()
        }
        # The user's own settings of these win (not the launcher's MLflow: its run is the
        # job's).  A job's share of the CPUs is its instances'.
        threads = cpu_share(self.threads_per_job, spec.instance_count)
        launcher = job_mlflow.inherited(os.environ)
        env = {"PYTHONUNBUFFERED": "1", **thread_environment(threads), **launcher}
        # The job's `python` is the launcher's interpreter, as on PAI it is the image's.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update(spec.environments)
        layout = contract.JobLayout(job_dir / "ml")
        env.update(
            contract.environment(layout, spec.hyperparameters, input_files, spec.output_dirs)
        )
        env.update(job_mlflow.environment(spec.environments, layout))
        return env

    def _warm_address(self, spec: JobSpec, job_dir: Path, env: dict[str, str]) -> str | None:
        """The warm interpreter that may fork the job's command: a sweep's, for a Python
        script (None: the command is exec'd)."""
        if self._warm is None:
            return None
        code_dir = Path(contract.JobLayout(job_dir / "ml").working_dir)
        return self._warm.address(spec.command, code_dir, env)

    def _start_runner(self, job_dir: Path, env: dict[str, str], warm: str | None = None) -> None:
        """Hand the job to the runner on standby, else start one for it (as a sweep runs,
        the next standby runner starts at once, while the jobs run); with the address of
        the ``warm`` interpreter that may fork its command."""
        arguments = [
            str(job_dir),
            str(self.stop_grace_period),
            self.install_requirements,
            str(self.root / ".cache"),
            *([warm] if warm else []),
        ]
        forked = self._standby.hand_over(arguments, env)
        if forked is None:
            runner = _spawn_runner(arguments, env, cwd=job_dir)
            self._children[job_dir.name] = runner
            forked = (runner.pid, None)
        self._started[job_dir.name] = forked
        self._standby.replenish()

    # -- status / logs / stop --------------------------------------------------------------

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        exited = self._exited_runners()
        statuses = {handle.id: self._status(handle.id, exited) for handle in handles}
        for job_id, status in statuses.items():
            if status.state.terminal:
                self._forget(job_id)
        return statuses

    def wait(self, handles: Sequence[JobHandle], timeout: float) -> None:
        """Sleep until a runner exits (it has then written the job's final state) or timeout."""
        descriptors = [self._runner_fd(handle.id) for handle in handles]
        live = [fd for fd in descriptors if fd is not None]
        if live and len(live) == len(descriptors):
            select.select(live, [], [], timeout)
        else:
            time.sleep(timeout)  # a job without a live runner: its state comes from poll

    def _runner_fd(self, job_id: str) -> int | None:
        if job_id not in self._pidfds:
            pid, start = self._runner(self.job_dir(job_id))
            if pid is None:
                return None
            try:
                descriptor = os.pidfd_open(pid)
            except OSError:
                return None
            if not process_alive(pid, start):  # the pid was reused before we opened it
                os.close(descriptor)
                return None
            self._pidfds[job_id] = (descriptor, pid)
        return self._pidfds[job_id][0]

    def _exited_runners(self) -> set[int]:
        """The pidfds of the runners waited on here that have exited: one system call."""
        if not self._pidfds:
            return set()
        watch = select.poll()
        for descriptor, _ in self._pidfds.values():
            watch.register(descriptor, select.POLLIN)
        return {descriptor for descriptor, _ in watch.poll(0)}

    def _runner_alive(self, job_id: str, state: dict[str, Any], exited: set[int]) -> bool:
        """Whether the runner a job's state names still runs: its pidfd is not among those
        ``exited`` (looked at before its state was read), else as :func:`process_alive` says."""
        alive = self._watched_alive(job_id, state["runner_pid"], exited)
        if alive is None:
            return process_alive(state["runner_pid"], state.get("runner_start"))
        return alive

    def _command_runs(self, job_id: str, exited: set[int]) -> bool:
        """Whether the job's command runs, its runner alive (by its pidfd), as its state last
        read says: the runner then writes its state again only as it exits."""
        seen = self._states.get(job_id)
        if seen is None or "pgid" not in seen.data:
            return False
        return bool(self._watched_alive(job_id, seen.data["runner_pid"], exited))

    def _watched_alive(self, job_id: str, pid: int, exited: set[int]) -> bool | None:
        """Whether the job's runner ``pid`` still runs, if this backend holds its pidfd."""
        watched = self._pidfds.get(job_id)
        if watched is None or watched[1] != pid:
            return None
        return watched[0] not in exited

    def _state(self, job_id: str, *, fresh: bool = False) -> StateFile | None:
        """The job's ``state.json`` (None until its runner writes it), parsed again only when
        the file changed (the runner replaces it whole: a new inode, mtime and size), or
        with ``fresh``."""
        path = f"{self._root}/{job_id}/{STATE_FILE}"
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return None
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        seen = self._states.get(job_id)
        if seen is not None and seen.key == key and not fresh:
            return seen
        data = read_json(path)
        if data is None:
            return None
        seen = self._states[job_id] = StateFile(key, data, _status_of(data))
        return seen

    def _runner(self, job_dir: Path) -> tuple[int | None, str | None]:
        """The live runner of a job (pid, start time): the one in its state, else the one
        this backend just started and that has not written its state yet."""
        seen = self._state(job_dir.name)
        if seen is not None and seen.data.get("runner_pid"):
            pid, start = seen.data["runner_pid"], seen.data.get("runner_start")
        elif job_dir.name in self._started:
            pid, start = self._started[job_dir.name]
        else:
            return None, None
        return (pid, start) if process_alive(pid, start) else (None, None)

    def _forget(self, job_id: str) -> None:
        self._states.pop(job_id, None)
        watched = self._pidfds.pop(job_id, None)
        if watched is not None:
            os.close(watched[0])
        self._started.pop(job_id, None)
        child = self._children.pop(job_id, None)
        if child is not None:
            child.wait()  # reap the runner, which exits right after writing the final state

    def _status(self, job_id: str, exited: set[int]) -> JobStatus:
        if self._command_runs(job_id, exited):
            return self._states[job_id].status
        seen = self._state(job_id)
        if seen is None:
            job_dir = self.job_dir(job_id)
            starting = lock_held(job_dir / LOCK_FILE) or self._runner(job_dir)[0] is not None
            if starting or self.jobs.starting(job_id):
                return JobStatus(JobState.PENDING)
            seen = self._state(job_id)  # it may have appeared meanwhile
            if seen is None:
                return JobStatus(
                    JobState.FAILED, reason="the job's runner never started", infrastructure=True
                )
        status = seen.status
        if status.state.terminal or self._runner_alive(job_id, seen.data, exited):
            return status
        latest = self._state(job_id, fresh=True)  # it may have just finished
        if latest is not None and latest.status.state.terminal:
            return latest.status
        return JobStatus(
            JobState.FAILED,
            reason="the job's runner process died",
            started_at=status.started_at,
            infrastructure=True,
        )

    def read_logs(self, handle: JobHandle, cursor: int, *, final: bool = False) -> LogChunk:
        return read_log_file(self.job_dir(handle.id) / "job.log", cursor, final)

    def instance_logs(self, handle: JobHandle) -> dict[str, Path]:
        return local_instances.instance_logs(self.job_dir(handle.id))

    def label(self, handle: JobHandle, labels: Mapping[str, str]) -> None:
        """A local job's labels are in its spec.json, written once: nothing to update."""

    def stop(self, handle: JobHandle) -> None:
        job_dir = self.job_dir(handle.id)
        (job_dir / "stop").touch()
        pid, _ = self._runner(job_dir)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # the runner stops the process group
            return
        # The runner is gone: what it ran, the job's command or its instances', goes too.
        states = [read_json(job_dir / STATE_FILE) or {}, *local_instances.instance_states(job_dir)]
        for state in states:
            if state.get("pgid") and not JobState(state["state"]).terminal:
                kill_group(state["pgid"], signal.SIGKILL)


@dataclass(frozen=True)
class StateFile:
    """A job's ``state.json`` as last read: its stat key, its data and the status it says
    (the runner's liveness aside).  The data is shared: never change it."""

    key: StatKey
    data: dict[str, Any]
    status: JobStatus


def _status_of(state: dict[str, Any]) -> JobStatus:
    if NO_PRIVATE_ML in state:
        _tell_no_private_ml(state[NO_PRIVATE_ML])
    return JobStatus(
        state=JobState(state["state"]),
        reason=state.get("reason"),
        exit_code=state.get("exit_code"),
        started_at=state.get("started_at"),
        ended_at=state.get("ended_at"),
        infrastructure=FULL_DISK in state or bool(state.get(PLATFORM_FAILURE)),
        full_disk=state.get(FULL_DISK),
    )


def _tell_no_private_ml(why: str) -> None:
    """Say once per launcher that local jobs here see the host's ``/ml``, and what follows."""
    global _told_no_private_ml
    if not _told_no_private_ml:
        _told_no_private_ml = True
        log.warning(
            "backend=local: this machine gives jobs no private /ml (%s): a job that writes "
            "under /ml is reported FAILED; use backend=docker for such scripts",
            why,
        )


def _link_inputs(spec: JobSpec, job_dir: Path) -> None:
    """Each input channel's directory in the job's ``/ml`` mirror links to its local data."""
    layout = contract.JobLayout(job_dir / "ml")
    for channel, source in spec.inputs.items():
        channel_dir = Path(layout.input_dir(channel))
        channel_dir.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            channel_dir.symlink_to(source, target_is_directory=True)
        else:
            channel_dir.mkdir()
            (channel_dir / Path(source).name).symlink_to(source)


def _spawn_runner(
    arguments: list[str], env: dict[str, str], *, cwd: Path | None = None, piped: bool = False
) -> subprocess.Popen[bytes]:
    """A runner process in a session of its own (the job survives the launcher); ``piped``:
    on standby, taking jobs on its standard input and answering on its standard output."""
    stream = subprocess.PIPE if piped else subprocess.DEVNULL
    return subprocess.Popen(
        # -S: the runner needs no site-packages to start (it adds them if it must)
        [sys.executable, "-S", local_runner.__file__, *arguments],
        env=env,
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
        stdin=stream,
        stdout=stream,
        stderr=subprocess.DEVNULL,
    )


class StandbyRunner:
    """A runner started ahead, its imports done, that forks a runner for each job handed to it
    (:func:`paiexp.backends.local_runner.stand_by`)."""

    def __init__(self) -> None:
        self.arguments: list[str] | None = None  # kept only for sweeps (keep)
        self.process: subprocess.Popen[bytes] | None = None

    def keep(self, *, warm: bool) -> None:
        """Keep one ready from now on; ``warm``: ready to have jobs forked warm."""
        self.arguments = [local_runner.STANDBY, *([local_runner.WARM_STANDBY] if warm else [])]
        self.replenish()

    def replenish(self) -> None:
        """Start it again if it is gone."""
        if self.arguments is not None and (self.process is None or self.process.poll() is not None):
            self.process = _spawn_runner(self.arguments, dict(os.environ), piped=True)

    def hand_over(self, arguments: list[str], env: dict[str, str]) -> tuple[int, str | None] | None:
        """The pid and start time of the runner it forked for this job; None if there is
        none to fork it (it died, or did not answer in time: it is stopped then)."""
        process = self.process
        if process is None:
            return None
        assert process.stdin is not None and process.stdout is not None
        order = json.dumps({"args": arguments, "env": env}).encode() + b"\n"
        reply = b""
        try:
            process.stdin.write(order)
            process.stdin.flush()
            if select.select([process.stdout], [], [], STANDBY_REPLY_TIMEOUT)[0]:
                reply = process.stdout.readline()
        except (BrokenPipeError, ValueError):
            pass
        if not reply.endswith(b"\n"):
            self.dismiss(kill=True)
            return None
        pid, start = reply.decode().split()
        return int(pid), None if start == "None" else start

    def dismiss(self, *, kill: bool = False) -> None:
        """No more jobs: it exits as its pipe closes (the runners it forked run on)."""
        process, self.process = self.process, None
        if process is None:
            return
        if kill:
            process.kill()
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        process.stdout.close()
        process.wait()
