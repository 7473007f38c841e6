"""A trial's attempts: what a re-run inherits from the job the platform lost.

A trial whose job was lost (spot instances reclaimed, a container killed, a runner gone) is
re-run as a new trial with a new job. It carries the earlier attempts (job name, reason,
seconds lost) for its run to name, and the lost job's checkpoints URI, which its job starts
from (``JobSpec.checkpoints``: on PAI the checkpoints channel, elsewhere a copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paiexp.sweep.records import ATTEMPTS, CHECKPOINTS, REASON_LIMIT

if TYPE_CHECKING:
    from optuna import Trial
    from optuna.trial import FrozenTrial

CHECKPOINTS_CHANNEL = "checkpoints"


def carried(
    trial: Trial, job: str, reason: str, seconds: float, outputs: dict[str, str]
) -> dict[str, Any]:
    """The user attributes a re-run of ``trial`` starts with, after its job ``job`` ended for
    ``reason`` having run ``seconds``; ``outputs`` its output channels' URIs ({} if it never
    ran: the re-run resumes from what the trial itself started from)."""
    history = [*earlier(trial), {"job": job, "reason": reason[:REASON_LIMIT], "seconds": seconds}]
    attrs: dict[str, Any] = {ATTEMPTS: history}
    checkpoints = outputs.get(CHECKPOINTS_CHANNEL) or trial.user_attrs.get(CHECKPOINTS)
    if checkpoints:
        attrs[CHECKPOINTS] = str(checkpoints)
    return attrs


def earlier(trial: Trial | FrozenTrial) -> list[dict[str, Any]]:
    """The trial's earlier attempts, oldest first."""
    return list(trial.user_attrs.get(ATTEMPTS) or [])


def checkpoints(trial: Trial | FrozenTrial) -> str | None:
    """The checkpoints the trial's job starts from, if it re-runs a lost one."""
    value = trial.user_attrs.get(CHECKPOINTS)
    return str(value) if value else None


def tags(trial: Trial | FrozenTrial, job: str) -> dict[str, str]:
    """Its run's tags naming each attempt, the last its own job, and the time lost."""
    history = earlier(trial)
    if not history:
        return {}
    lines = [f"{a['job']}: {a['reason']} ({a['seconds']:.0f} s lost)" for a in history]
    return {
        "paiexp.attempts": "\n".join([*lines, f"{job}: this run"]),
        "paiexp.attempt_jobs": ",".join([*(a["job"] for a in history), job]),
        "paiexp.time_lost_s": f"{sum(float(a['seconds']) for a in history):.1f}",
    }
