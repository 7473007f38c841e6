"""The runner of a multi-instance local job: one instance runner per instance, one outcome.

A job directory holding ``topology.json`` is a multi-instance job's (laid out by
:mod:`paiexp.backends.local_instances`); the runner started for it (by the launcher, or on
standby) is a :class:`GroupRunner`.  It is the job's runner as the launcher sees it: it holds
the job's lock, writes its ``state.json``, installs its requirements once, enforces its
``max_run_time`` and persists its outputs.  In between, it starts an ordinary runner
(:mod:`paiexp.backends.local_runner`) for each instance directory, each with the instance's
environment: the job's, its ``PAI_*`` paths in the instance's own tree, and the distributed
variables (:mod:`paiexp.contract.distributed`) with the master on the loopback at a free port.

The job succeeds when every instance does.  The first instance to fail fails the job, its
reason naming the instance; the others are then stopped, as on SIGTERM (a stop, or pruning)
or past ``max_run_time``: each instance runner stops its command's process group within the
grace period.  Standard library only, like the runner.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys

from paiexp.backends import local_runner_base, mlroot
from paiexp.contract.distributed import Address, Topology
from paiexp.util.jsonfiles import read_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO

TOPOLOGY_FILE = "topology.json"
INSTANCES_DIR = "instances"
LOOPBACK = "127.0.0.1"
LAST_LINE_BYTES = 4096  # of an instance's log, read for the last line of a failed one


def is_group(job_dir: str) -> bool:
    """Whether the job in ``job_dir`` has several instances."""
    return os.path.isfile(os.path.join(job_dir, TOPOLOGY_FILE))


class GroupRunner(local_runner_base.Runner):
    """Runs a multi-instance job as one runner per instance (see the module's docstring)."""

    def __init__(
        self, job_dir: str, grace: float, install: str, cache_dir: str, warm: str | None = None
    ) -> None:
        super().__init__(job_dir, grace, install, cache_dir, warm)
        self.topology = Topology.from_dict(read_json(self.path(TOPOLOGY_FILE)))
        self.running: dict[int, tuple[int, subprocess.Popen[bytes]]] = {}  # pidfd -> rank, runner

    def enter_private_ml(self) -> None:
        """Each instance enters its own ``/ml``; this runner stays in the host's view."""

    def run_command(self, log: IO[bytes]) -> int:
        if self.stop_reason is not None:
            return -signal.SIGTERM
        addresses = [(LOOPBACK, port) for port in free_ports(self.topology.count)]
        for rank in range(self.topology.count):
            runner = self.start_instance(rank, addresses)
            self.running[os.pidfd_open(runner.pid)] = (rank, runner)
        self.write_state(instances=self.topology.names, master_port=addresses[0][1])
        if self.stop_reason is not None:  # a stop arrived while the instances started
            self.terminate(*self.stop_reason)
        max_run_time = self.spec.get("max_run_time")
        if max_run_time:
            self.schedule("max_run_time", max_run_time)
        return self.wait_instances()

    def start_instance(self, rank: int, addresses: list[Address]) -> subprocess.Popen[bytes]:
        """The runner of instance ``rank``, in its directory, with its environment."""
        directory = self.instance_dir(rank)
        env = dict(os.environ)
        mlroot.rebase_paths(env, self.path("ml"), os.path.join(directory, "ml"))
        env.update(self.topology.environment(rank, addresses))
        grace, cache = str(self.grace), self.cache_dir
        return subprocess.Popen(
            [
                sys.executable,
                "-S",
                local_runner_base.RUNNER_SCRIPT,
                directory,
                grace,
                "never",
                cache,
            ]
            + ([self.warm] if self.warm else []),
            env=env,
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def instance_dir(self, rank: int) -> str:
        return self.path(INSTANCES_DIR, self.topology.name(rank))

    def wait_instances(self) -> int:
        """Wait for every instance's runner; the first failure stops the rest.  The exit code
        of the first instance that failed, else 0."""
        watch = select.poll()
        for descriptor in self.running:
            watch.register(descriptor, select.POLLIN)
        exit_code = 0
        while self.running:
            for descriptor, _ in watch.poll():  # a signal's handler runs, then it polls on
                watch.unregister(descriptor)
                rank, runner = self.running.pop(descriptor)
                os.close(descriptor)
                runner.wait()
                failure = self.failure(rank)
                if failure is not None and exit_code == 0 and self.stop_reason is None:
                    exit_code = failure[0]
                    self.terminate(local_runner_base.FAILED, failure[1])
        return exit_code

    def failure(self, rank: int) -> tuple[int, str] | None:
        """How instance ``rank`` failed (its exit code and the job's reason naming it), or
        None if it succeeded or was stopped."""
        directory = self.instance_dir(rank)
        state = read_json(os.path.join(directory, "state.json")) or {}
        name = self.topology.name(rank)
        if state.get("state") in (local_runner_base.SUCCEEDED, local_runner_base.STOPPED):
            return None
        if state.get("state") != local_runner_base.FAILED:
            return 1, f"{name}: its runner died"
        reason = str(state.get("reason") or "failed").removeprefix("command ")
        last = last_line(os.path.join(directory, "job.log"))
        return state.get("exit_code") or 1, f"{name} {reason}" + (f": {last}" if last else "")

    def terminate(self, state: str, reason: str) -> None:
        """Stop every instance still running: each instance's runner stops its command's
        process group (SIGTERM, then SIGKILL after the grace period)."""
        if self.stop_reason is None:
            self.stop_reason = (state, reason)
        for _, runner in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner.pid, signal.SIGTERM)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on the loopback now."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def last_line(path: str) -> str:
    """The last non-blank line of a log file ('' if none)."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - LAST_LINE_BYTES))
            lines = log.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")
