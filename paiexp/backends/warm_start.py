"""The runner's side of a warm start: a job whose command is ``python SCRIPT ARGS`` (this
interpreter) is forked by its sweep's warm interpreter (:mod:`paiexp.backends.warm`) instead
of exec'd; any other command, or a warm interpreter that cannot fork it, runs as before.

The command's words are expanded by ``sh`` itself, in the job's environment and directory, so
the script sees exactly the argv ``sh -c`` would give it.  Standard library only, imported
by the runner only for a job that has a warm interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from paiexp.util.processes import kill_group

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

# Shell syntax beyond one simple command (lists, pipes, redirections, substitutions, comments):
# such a command runs under sh as before.
SHELL_SYNTAX = frozenset(";&|<>()`#\n\\")
NAMESPACES = ("user", "mnt")  # the runner's, joined by the job in this order


class WarmProcess:
    """A job forked by the warm interpreter, which reports its exit code here; so does the
    job itself as it exits (it holds this connection too), so that a job whose warm
    interpreter died runs on to its end, followed."""

    def __init__(self, pid: int, replies: BinaryIO, log: int) -> None:
        self.pid = pid
        self.replies = replies
        self.log = log
        self.core_dumped = False
        self.status_lost = False  # it ended untold: the warm interpreter had died

    def wait(self) -> int | None:
        """The job's exit code as ``Popen.wait`` gives it (-N: killed by signal N); None when
        it ended without telling (killed by a signal, ``os._exit``) after its warm
        interpreter died: its exit status is lost."""
        while (reply := _read_reply(self.replies)) is not None:
            if "exit" in reply:
                self.core_dumped = bool(reply.get("core"))
                return int(reply["exit"])
        # both ends closed untold; what it left running goes with it, as after any job
        kill_group(self.pid, signal.SIGKILL)
        self.status_lost = True
        return None

    def as_sh_reports(self, exit_code: int) -> int:
        """The exit code ``sh -c`` reports for its command's ``exit_code``: a signal N that
        killed it is 128 + N, said in the log as ``sh`` says it (not for SIGINT, SIGPIPE)."""
        if exit_code >= 0:
            return exit_code
        number = -exit_code
        if number not in (signal.SIGINT, signal.SIGPIPE):
            message = signal.strsignal(number) or f"Signal {number}"
            core = " (core dumped)" if self.core_dumped else ""
            os.write(self.log, f"{message}{core}\n".encode())
        return 128 + number


def start(
    address: str, command: str, env: dict[str, str], cwd: str, log: int
) -> WarmProcess | None:
    """The job forked by the warm interpreter at ``address``, or None: the command is not
    ``python SCRIPT ...`` with this interpreter, or the warm interpreter cannot fork it."""
    found = python_script(command, env, cwd)
    if found is None:
        return None
    executable, argv = found
    env = {**env, "PWD": _pwd(env.get("PWD"), cwd)}
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect("\0" + address)
    except OSError:  # it has gone (its launcher finished)
        connection.close()
        return None
    namespaces = [os.open(f"/proc/self/ns/{name}", os.O_RDONLY) for name in NAMESPACES]
    order = {"argv": argv, "executable": executable, "env": env, "cwd": cwd}
    try:
        socket.send_fds(connection, [json.dumps(order).encode() + b"\n"], [log, *namespaces])
    except OSError:
        connection.close()
        return None
    finally:
        for descriptor in namespaces:
            os.close(descriptor)
    replies = connection.makefile("rb")
    reply = _read_reply(replies)
    if reply is None or "pid" not in reply:
        connection.close()
        return None
    return WarmProcess(int(reply["pid"]), replies, log)


def _pwd(pwd: str | None, cwd: str) -> str:
    """``PWD`` as ``sh`` exports it to its command: kept if it names ``cwd``, else ``cwd``."""
    if pwd and os.path.isabs(pwd):
        try:
            if os.path.samefile(pwd, cwd):
                return pwd
        except OSError:
            pass
    return cwd


def _read_reply(replies: BinaryIO) -> dict[str, int] | None:
    """The warm interpreter's next line; None when it closed the connection.  A reset is a
    close: the warm interpreter died with our order unread (so forked nothing), or it and the
    job are both gone."""
    try:
        line = replies.readline()
    except ConnectionResetError:
        return None
    if not line.endswith(b"\n"):
        return None
    reply: dict[str, int] = json.loads(line)
    return reply


def python_script(command: str, env: dict[str, str], cwd: str) -> tuple[str, list[str]] | None:
    """``(interpreter, [SCRIPT, *ARGS])`` when ``command`` runs a Python script file with this
    interpreter (``python``/``python3`` found on the job's PATH, or its path), else None."""
    if any(character in SHELL_SYNTAX for character in command):
        return None
    parts = command.split(None, 1)
    if len(parts) < 2 or "=" in parts[0] or "$" in parts[0]:
        return None
    executable = _this_interpreter(parts[0], env.get("PATH", ""))
    if executable is None:
        return None
    argv = _expand(parts[1], env, cwd)
    if not argv or argv[0].startswith("-") or not os.path.isfile(os.path.join(cwd, argv[0])):
        return None  # interpreter options, or no such script: as before, python says so
    return executable, argv


def _this_interpreter(word: str, path: str) -> str | None:
    """Where ``word`` runs this interpreter from (the same file, in the same environment's
    directory), found as ``sh`` finds it; None if it runs another program."""
    if "/" in word:
        candidates = [word]
    else:
        candidates = [os.path.join(directory or ".", word) for directory in path.split(":")]
    here = os.path.dirname(os.path.abspath(sys.executable))
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            same_file = os.path.realpath(candidate) == os.path.realpath(sys.executable)
            same_environment = os.path.dirname(os.path.abspath(candidate)) == here
            return candidate if same_file and same_environment else None
    return None


def _expand(words: str, env: dict[str, str], cwd: str) -> list[str] | None:
    """``words`` as ``sh`` expands a command's arguments (parameters, field splitting,
    globbing, quote removal); None if ``sh`` finds them malformed."""
    script = f'for word in {words}; do printf "%s\\0" "$word"; done'
    result = subprocess.run(
        ["/bin/sh", "-c", script],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        return None
    return [word.decode("utf-8", "surrogateescape") for word in result.stdout.split(b"\0")[:-1]]
