"""Why a job's command failed, from its exit code.

Standard library only: the local job runner imports it without ``site``.
"""

from __future__ import annotations

import signal

SHELL_SIGNAL_BASE = 128  # a shell or container reports death by signal N as 128 + N


def killed_by(exit_code: int) -> signal.Signals | None:
    """The signal that ended the command: a negative code is a process's own status (-N), one
    above 128 the shell's or container's (128 + N)."""
    number = -exit_code if exit_code < 0 else exit_code - SHELL_SIGNAL_BASE
    if number <= 0:
        return None
    try:
        return signal.Signals(number)
    except ValueError:  # a real-time signal, or none at all
        return None


def failure_reason(exit_code: int, *, sigkill_hint: str = "") -> str:
    """The reason a command with a nonzero ``exit_code`` failed; ``sigkill_hint`` follows a
    SIGKILL's name (what the kernel said of it, see :mod:`paiexp.util.oom`)."""
    killer = killed_by(exit_code)
    if killer is None:
        return f"command exited with code {exit_code}"
    hint = sigkill_hint if killer is signal.SIGKILL else ""
    return f"command killed by {killer.name}{hint}"
