"""Leaving as Python's exit would, without its teardown: the same output, order and exit code
as ``sys.exit``, for the ``paiexp`` command and a warm job alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env, run_paiexp

SCRIPT = """
import atexit, sys, threading
from paiexp.util.quick_exit import exit_as_python

gate = threading.Event()

def late():
    gate.wait()  # let go as the main thread leaves: it is waited for
    print("thread done")

threading.Thread(target=late).start()
atexit.register(print, "atexit ran")
print("buffered output")
code = {code!r}
gate.set()
if sys.argv[1] == "quick":
    exit_as_python(code)
sys.exit(code)
"""


@pytest.mark.parametrize("code", [None, 0, 3, 256 + 4, "a message"])
def test_a_quick_exit_ends_as_sys_exit_does(code: object) -> None:
    ends = {}
    for way in ("quick", "python"):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT.format(code=code), way],
            capture_output=True,
            text=True,
            timeout=60,
        )
        ends[way] = (done.returncode, done.stdout, done.stderr)
    assert ends["quick"] == ends["python"]
    assert ends["quick"][1] == "buffered output\nthread done\natexit ran\n"


@pytest.mark.slow
def test_the_command_exits_quickly_with_its_code_and_all_its_output(project: Path) -> None:
    shown = run_paiexp(project, "--cfg", "job")  # piped: block-buffered, flushed at exit
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("job:") and shown.stdout.endswith("\n")
    assert (
        shown.stdout
        == subprocess.run(
            [sys.executable, "-c", "from paiexp.cli import main; main(['--cfg', 'job'])"],
            cwd=project,
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=60,
        ).stdout
    )
    wrong = run_paiexp(project, "job.no_such_key=1")
    assert (wrong.returncode, wrong.stdout) == (2, "")
    assert wrong.stderr.startswith("paiexp: error: ") and "Traceback" not in wrong.stderr
    usage = run_paiexp(project, "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: paiexp")
    unknown = run_paiexp(project, "--no-such-flag")
    assert unknown.returncode == 2 and "unrecognized arguments" in unknown.stderr
