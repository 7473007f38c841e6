"""Leaving an interpreter as its own exit would, without its teardown.

Python's exit joins the other threads, runs the ``atexit`` functions, prints a code that is
not a number and flushes the standard streams; then it frees every module and object one by
one, which for a process that imported MLflow, Optuna, pandas or xgboost takes a quarter of a
second and changes nothing another process can see.  :func:`exit_as_python` does the first
part, then leaves.  Standard library only: the warm interpreter's jobs use it too.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def exit_as_python(code: object, tell: Callable[[int], None] | None = None) -> NoReturn:
    """End the process as the interpreter's own exit would for ``sys.exit(code)``: its other
    (non-daemon) threads joined, ``atexit`` functions run, a code that is not a number
    printed, standard streams flushed (120 if that fails); then leave at once, having
    passed ``tell`` the exit status, if given."""
    threading = sys.modules.get("threading")
    if threading is not None:  # what the interpreter calls first as it exits: the functions
        threading._shutdown()  # threading._register_atexit took, then joins the threads
    atexit._run_exitfuncs()
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120
    if tell is not None:
        tell(status & 0xFF)
    os._exit(status & 0xFF)
