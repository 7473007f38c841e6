"""The detached runner of one local job: ``python -S local_runner.py JOB_DIR GRACE INSTALL CACHE
[WARM]`` (or ``... --standby``: started ahead, it forks a runner for each job handed to it).

What the runner does is :class:`~paiexp.backends.local_runner_base.Runner`'s (a
multi-instance job's is :class:`~paiexp.backends.local_group.GroupRunner`); this is its entry.
It starts for every job, so it is kept lean: started by path without ``site``, it imports a
handful of standard modules (the rest only when needed) and uses one interval timer instead
of threads.  A sweep keeps one on standby, started and imported ahead, that forks a runner
for each of its jobs: a job starts without an interpreter's start-up; given the address of the
sweep's ``WARM`` interpreter, it has a ``python SCRIPT`` command forked from it
(:mod:`paiexp.backends.warm_start`), not exec'd.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

if __name__ == "__main__":  # started by path without ``site``: the package's parent on the path
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paiexp.backends.local_runner_base import FAILED, Runner
from paiexp.util.processes import process_start_time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STANDBY = "--standby"
WARM_STANDBY = "--warm"  # after STANDBY: the sweep's jobs may be forked warm


def prepare(warm: bool) -> None:
    """On standby, before any job: import what a job may need, so that its start does not
    wait for it (the hash of the requirements' marker; with ``warm``, the warm start's)."""
    if warm:
        from paiexp.backends import warm_start  # noqa: F401
    import hashlib  # noqa: F401
    import site  # noqa: F401


def stand_by(warm: bool) -> int:
    """A sweep's runner on standby: its imports done once, it forks a runner for each job
    the launcher hands over as one JSON line ``{"args": [JOB_DIR, GRACE, INSTALL, CACHE,
    [WARM]], "env": {...}}`` on standard input, and answers with the runner's pid and start
    time as one line on standard output.  It exits when the launcher closes the pipe (it
    finished, or died); the runners it forked run on, each in its own session."""
    prepare(warm)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its runners are reaped as they exit
    orders = sys.stdin.buffer
    while True:
        line = orders.readline()
        if not line.endswith(b"\n"):
            return 0
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run_handed_over(json.loads(line))
            finally:
                os._exit(code)  # never back into the loop, whatever happened
        os.write(sys.stdout.fileno(), f"{pid} {process_start_time(pid)}\n".encode())


def run_handed_over(order: dict[str, Any]) -> int:
    """In a runner forked on standby: become the job's runner as one started for it is (its
    own session, no standard streams, the job's environment and directory), and run it."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(null, stream)
    os.close(null)
    os.environ.clear()
    os.environ.update(order["env"])
    os.chdir(order["args"][0])
    return run_job([str(arg) for arg in order["args"]])


def run_job(argv: list[str]) -> int:
    """Run the job of ``JOB_DIR GRACE INSTALL CACHE [WARM]`` to its end."""
    job_dir, grace, install, cache_dir, *warm = argv
    kind = Runner
    if os.path.isfile(os.path.join(job_dir, "topology.json")):  # a multi-instance job
        from paiexp.backends.local_group import GroupRunner

        kind = GroupRunner
    runner = kind(job_dir, float(grace), install, cache_dir, *warm)
    try:
        runner.run()
    except Exception as exc:  # a broken runner must still leave a final state behind
        runner.write_state(
            state=FAILED, reason=f"paiexp runner error: {exc!r}", ended_at=time.time()
        )
        raise
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == [STANDBY]:
        return stand_by(warm=WARM_STANDBY in argv)
    return run_job(argv)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    os._exit(code)  # the state is written: the launcher waits on this exit, spare it teardown
