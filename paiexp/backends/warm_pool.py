"""The launcher's side of warm starts: which modules a job's script imports, and the warm
interpreters (:mod:`paiexp.backends.warm`) a sweep keeps ready, one per script and settings.

A job whose command is ``python SCRIPT ...`` gets the address of a warm interpreter that has
imported what ``SCRIPT`` imports (read with :mod:`ast`; modules of the job's own code
directory are left to the job) and the modules named in ``backend.warm_imports``; the job's
runner decides at run time whether the job can be forked from it.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import paiexp
from paiexp.contract.layout import TRIAL_VARIABLE

PYTHON = re.compile(r"python(3(\.\d+)?)?")
BACKLOG = 64  # runners that may wait for the warm interpreter's imports at once
# Started with ``-c`` (whose '' on sys.path would let the directory shadow modules): the
# package's parent serves the import of the warm interpreter, then leaves sys.path.
BOOT = (
    "import sys; sys.path[0] = {parent!r}; from paiexp.backends import warm; del sys.path[0]; "
    "warm.main(sys.argv[1:])"
)
Key = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]


def script_imports(command: str, code_dir: Path) -> list[str] | None:
    """The modules the script of a ``python SCRIPT ...`` command imports, other than its
    code directory's own; None if the command runs no Python script of ``code_dir``."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if len(words) < 2 or not PYTHON.fullmatch(os.path.basename(words[0])):
        return None
    script = code_dir / words[1]
    if not words[1].endswith(".py") or not script.is_file():
        return None
    names = imported_modules(script.read_bytes())
    if names is None:
        return None  # python says what is wrong with it, as before
    own = {path.stem for path in code_dir.iterdir()}
    return sorted(name for name in names if name.split(".")[0] not in {*own, "__future__"})


@functools.lru_cache(maxsize=16)
def imported_modules(source: bytes) -> frozenset[str] | None:
    """The modules a script's source imports by absolute name; None if it does not parse.
    Kept per source: a sweep's jobs run copies of one script."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return frozenset(names)


class WarmInterpreters:
    """The warm interpreters of one launcher, started as its jobs first need them."""

    def __init__(self, extra_imports: list[str]) -> None:
        self.extra_imports = list(extra_imports)
        self.started: dict[Key, tuple[str, subprocess.Popen[bytes]]] = {}

    def address(self, command: str, code_dir: Path, env: dict[str, str]) -> str | None:
        """The address of a warm interpreter for a job (started now if none is), or None
        if the job's command runs no Python script."""
        modules = script_imports(command, code_dir)
        if modules is None:
            return None
        modules = sorted({*modules, *self.extra_imports})
        # Imported under the jobs' settings (thread counts above all); a job's own values aside
        # (the contract's PAI_*, its trial's number, its MLflow store's URI: any value naming
        # its directory), which its fork gets with the rest of its environment.
        job_dir = str(code_dir.parent.parent)
        settings = {
            name: value
            for name, value in env.items()
            if not name.startswith("PAI_") and name != TRIAL_VARIABLE and job_dir not in value
        }
        key = (tuple(modules), tuple(sorted(settings.items())))
        started = self.started.get(key)
        if started is None or started[1].poll() is not None:  # none yet, or it died
            self.started[key] = _start(modules, settings)
        return self.started[key][0]

    def dismiss(self) -> None:
        """No more jobs: each warm interpreter exits once the jobs it forked have ended."""
        for _, process in self.started.values():
            assert process.stdin is not None
            process.stdin.close()
        self.started.clear()


def _start(modules: list[str], env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    """A warm interpreter importing ``modules``, its socket bound and listening before it
    starts: a runner asking before its imports are done waits for them."""
    address = f"paiexp-warm-{os.getpid()}-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(BACKLOG)
    parent = str(Path(paiexp.__file__).resolve().parent.parent)
    with listener:
        process = subprocess.Popen(
            [sys.executable, "-c", BOOT.format(parent=parent), str(listener.fileno()), *modules],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=[listener.fileno()],
            start_new_session=True,
        )
    return address, process
