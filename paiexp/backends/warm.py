"""The warm interpreter of a local sweep: it imports a script's modules once, then forks each
of its jobs, which then runs the script as a fresh ``python SCRIPT ARGS`` would.

The launcher starts one per script and settings (:mod:`paiexp.backends.warm_pool`) with the
jobs' environment (so OpenMP/BLAS thread pools are sized to a job's share), bound to an
abstract Unix socket it listens on; a job's runner (:mod:`paiexp.backends.warm_start`) sends it
the job's argv, environment and working directory with its log and namespaces as descriptors.
The fork becomes the job: it joins the runner's private ``/ml`` mount namespace, starts a
session (its own process group), takes the log as stdout and stderr, replaces ``os.environ``,
reseeds the random state it inherited, runs the script as ``__main__`` and exits as Python
does (its other threads joined, ``atexit`` run, output flushed), without freeing the objects
of the imports one by one, which takes the fork most of a tenth of a second.  The warm
interpreter reports the fork's pid, then its exit code, to the runner; the fork keeps the
runner's connection and tells its own exit code as it exits, so that should the warm
interpreter die first, its jobs run on and their runners still learn how they ended.  Where
an import fails, it forks nothing: each runner it answers runs its job as before.  It stops
taking jobs when the launcher's pipe (its standard input) closes, and exits once its jobs
have ended.

Standard library only.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import gc
import importlib
import importlib.machinery
import json
import os
import selectors
import signal
import socket
import struct
import sys
import types
from typing import Any

from paiexp.util.quick_exit import exit_as_python

MAX_DESCRIPTORS = 3  # the job's log, then the runner's user and mount namespaces (if its own)
ORDER_BYTES = 1 << 20  # an order's JSON: argv, environment, working directory
ORDER_TIMEOUT = 10.0  # seconds a runner has to send its whole order once connected


def main(argv: list[str]) -> None:
    """``warm.py FD MODULE...``: serve the listening socket ``FD`` once ``MODULE``s are in."""
    listener = socket.socket(fileno=int(argv[0]))
    refusal = preload(argv[1:])
    job = serve(listener, refusal)
    if job is not None:  # in the fork: the job, run from the top of the stack
        order, descriptors, runner = job

        def tell_exit(status: int) -> None:  # its runner hears it should this process die
            tell(runner, exit=status)

        try:
            run_job(order, descriptors)
        except SystemExit as exc:
            exit_as_python(exc.code, tell_exit)
        exit_as_python(0, tell_exit)


def preload(modules: list[str]) -> str | None:
    """Import ``modules``; why one failed (then no job is forked here), or None."""
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a failing import may raise anything, even SystemExit
            return f"import {name}: {exc!r}"
    return None


Job = tuple[dict[str, Any], list[int], socket.socket]  # order, descriptors, the runner


def serve(listener: socket.socket, refusal: str | None) -> Job | None:
    """Fork a job for each runner that asks until the launcher goes and the jobs end; in a
    fork, return its order and descriptors (None in the warm interpreter, as it finishes)."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "launcher")
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> the job's pid, its runner
    accepting = True
    while accepting or running:
        for key, _ in selector.select():
            if key.data == "launcher":
                if os.read(key.fd, 4096):
                    continue
                selector.unregister(key.fd)
                selector.unregister(listener)
                listener.close()
                accepting = False
            elif key.data == "accept":
                connection, _ = listener.accept()
                forked = fork_job(connection, refusal)
                if isinstance(forked, tuple):  # the fork: shed the warm interpreter's files
                    selector.close()
                    listener.close()
                    for pidfd, (_, runner) in running.items():
                        os.close(pidfd)
                        runner.close()
                    return forked
                if forked is not None:
                    pidfd = os.pidfd_open(forked)
                    running[pidfd] = (forked, connection)
                    selector.register(pidfd, selectors.EVENT_READ, "exit")
            else:
                pid, runner = running.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                tell(runner, exit=os.waitstatus_to_exitcode(status), core=os.WCOREDUMP(status))
                runner.close()
    return None


def fork_job(connection: socket.socket, refusal: str | None) -> int | Job | None:
    """Read a runner's order and fork its job: the job's pid here, the order in the fork,
    None when there is no job to fork (the runner is told why and runs it as before)."""
    order: dict[str, Any]
    try:
        if not same_user(connection):
            connection.close()
            return None
        connection.settimeout(ORDER_TIMEOUT)  # a runner stuck mid-order holds up no other
        order, descriptors = read_order(connection)
        connection.settimeout(None)
    except (OSError, ValueError):  # the runner went away, or sent nonsense
        connection.close()
        return None
    if refusal is not None:
        for descriptor in descriptors:
            os.close(descriptor)
        tell(connection, cold=refusal)
        connection.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    # Out of the collector's sight: the job's final collection would otherwise touch (and
    # so copy) every page of what was imported here, costing it a third of a second.
    gc.freeze()
    pid = os.fork()
    if pid == 0:  # the job keeps its runner's connection, to tell its own exit
        return order, descriptors, connection
    os.setpgid(pid, pid)  # as the fork does: its group exists before the runner signals it
    for descriptor in descriptors:
        os.close(descriptor)
    tell(connection, pid=pid)
    return pid


def same_user(connection: socket.socket) -> bool:
    """Only this user's processes may have a job forked here."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    _, uid, _ = struct.unpack("3i", credentials)
    return bool(uid == os.getuid())


def read_order(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The runner's one JSON line, and the descriptors it sent with it."""
    data, descriptors, _, _ = socket.recv_fds(connection, ORDER_BYTES, MAX_DESCRIPTORS)
    while not data.endswith(b"\n"):
        more = connection.recv(ORDER_BYTES)
        if not more:
            raise ValueError("the order ended early")
        data += more
    return json.loads(data), descriptors


def tell(connection: socket.socket, **message: Any) -> None:
    """One JSON line to a runner; one that went away is not told."""
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps(message).encode() + b"\n")


# -- in the fork -------------------------------------------------------------------------------


def run_job(order: dict[str, Any], descriptors: list[int]) -> None:
    """Become the job, then run its script as ``__main__``; exits as ``python SCRIPT`` would."""
    log, *namespaces = descriptors
    for namespace in namespaces:
        join_namespace(namespace)
        os.close(namespace)
    os.setpgid(0, 0)
    os.chdir(order["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    # Python's own locale coercion, as at this interpreter's start (same locale variables).
    coerced = {} if "LC_CTYPE" in order["env"] else {"LC_CTYPE": os.environ.get("LC_CTYPE")}
    os.environ.clear()
    os.environ.update(order["env"])
    os.environ.update({name: value for name, value in coerced.items() if value is not None})
    # As the runner leaves them to its command: SIGINT and SIGHUP ignored, the rest default.
    for number in (signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)
    reseed()
    run_script(order["argv"], order["executable"])


def join_namespace(descriptor: int) -> None:
    """Enter the runner's namespace ``descriptor`` (its user namespace comes first), unless
    this process is in it already."""
    kind = os.readlink(f"/proc/self/fd/{descriptor}").split(":", 1)[0]
    if os.fstat(descriptor).st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(descriptor, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns {kind}: {os.strerror(code)}")


def reseed() -> None:
    """Fresh random state, as a new process has: Python's ``random`` reseeds itself at fork;
    the global generators of libraries the warm interpreter imported are reseeded here."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "seed"):
        torch.seed()


def run_script(argv: list[str], executable: str) -> None:
    """Run ``argv[0]`` as ``python`` runs a script: ``__main__`` with ``__file__`` its absolute
    path, its directory (symlinks resolved) first on ``sys.path``, an uncaught exception's
    traceback (from the script's own frame) on stderr and exit code 1."""
    script = argv[0]
    path = os.path.abspath(script)
    with open(path, "rb") as stream:
        source = stream.read()
    sys.argv = list(argv)
    sys.orig_argv = [os.path.basename(executable), *argv]
    sys.executable = executable
    if not sys.flags.safe_path:
        sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __annotations__={},
    )
    sys.modules["__main__"] = module
    try:
        code = compile(source, path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        traceback = exc.__traceback__.tb_next if exc.__traceback__ else None
        sys.excepthook(type(exc), exc.with_traceback(traceback), traceback)
        raise SystemExit(1) from None
