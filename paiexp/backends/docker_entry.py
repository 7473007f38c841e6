"""The entry script of a job's container: requirements, a max_run_time watchdog, the command.

The script runs under ``/bin/sh`` in the container (a docker job's, or an OpenPAI task role's,
whose commands end with it), appends everything to ``/paiexp/job.log`` (docker) and, when it
gives up, writes why to ``/paiexp/failure`` for the backend to report.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import paiexp.util.requirements
from paiexp.config.spec import JobSpec
from paiexp.util.requirements import requirement_lines

# Run by the image's Python: exit 0 when every requirement given is installed already.
SATISFIED = Path(paiexp.util.requirements.__file__).read_text()

FAILED_INSTALL = shlex.quote("installing the job's requirements failed (see log)")


def entry_script(
    spec: JobSpec,
    working_dir: Path,
    install_mode: str,
    grace_period: float,
    log_file: str | None = "/paiexp/job.log",
) -> str:
    """The container's entry point for ``spec``, whose code is laid out in ``working_dir``;
    its output goes to ``log_file`` (None: left on the container's stdout and stderr)."""
    lines = [
        "#!/bin/sh",
        f"# The entry point of paiexp job {spec.name} (generated).",
        *([f"exec >>{log_file} 2>&1"] if log_file else []),
        "cd /ml/usercode || exit 1",
    ]
    lines += install_lines(spec, working_dir, install_mode)
    if spec.max_run_time:
        reason = shlex.quote(f"exceeded max_run_time of {spec.max_run_time} s")
        lines.append(
            f"( trap '' TERM; sleep {spec.max_run_time}; echo {reason} >/paiexp/failure; "
            f"kill -TERM 0; sleep {grace_period:g}; kill -KILL 0 ) &"
        )
    lines.append(f"exec /bin/sh -c {shlex.quote(spec.command)}")
    return "\n".join(lines) + "\n"


def install_lines(spec: JobSpec, working_dir: Path, install_mode: str) -> list[str]:
    """Shell lines installing ``requirements`` and ``requirements.txt``, as PAI does."""
    requirements = requirement_lines(spec.requirements, str(working_dir))
    has_file = (working_dir / "requirements.txt").is_file()
    if not requirements or install_mode == "never":
        return []
    pip_args = [*spec.requirements, *(["-r", "requirements.txt"] if has_file else [])]
    install = (
        'PIP_BREAK_SYSTEM_PACKAGES=1 "$python" -m pip install --disable-pip-version-check '
        f"{shlex.join(pip_args)} || {{ echo {FAILED_INSTALL} >/paiexp/failure; exit 1; }}"
    )
    find_python = (
        'python=$(command -v python3 || command -v python) || { echo "[paiexp] no python '
        f'in the image to install requirements with"; echo {FAILED_INSTALL} >/paiexp/failure; '
        "exit 1; }"
    )
    announce = "echo " + shlex.quote(f"[paiexp] installing requirements: {shlex.join(pip_args)}")
    if install_mode == "always":
        return [find_python, announce, install]
    satisfied = "[paiexp] requirements already satisfied: " + ", ".join(requirements)
    return [
        find_python,
        f'if "$python" -c {shlex.quote(SATISFIED)} {shlex.join(requirements)}; then',
        f"  echo {shlex.quote(satisfied)}",
        "else",
        f"  {announce}",
        f"  {install}",
        "fi",
    ]
