"""A launcher of the command line's, started by the Python API as a process of its own: in
its own session (the Python process that started it may end, a notebook's kernel restart),
its output in ``.paiexp/launchers/`` of the project."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def launch_detached(
    overrides: tuple[str, ...], base_dir: Path, config_dirs: tuple[str, ...], label: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """``python -m paiexp OVERRIDES`` in ``base_dir``, detached: (its process, its log)."""
    launchers = base_dir / ".paiexp" / "launchers"
    launchers.mkdir(parents=True, exist_ok=True)
    log_path = launchers / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    argv = [sys.executable, "-m", "paiexp", *(f"--config-dir={d}" for d in config_dirs)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [*argv, *overrides],
            cwd=base_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: this process's end does not end it
        )
    return process, log_path
