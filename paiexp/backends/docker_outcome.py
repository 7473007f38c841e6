"""How a job's container ended: its end state and reason, from the engine's final state."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from paiexp.backends.base import JobState
from paiexp.backends.instance_types import Resources, format_size
from paiexp.util.exits import failure_reason


def outcome(job_dir: Path, state: dict[str, Any], resources: Resources) -> tuple[JobState, str]:
    """The job's end state and reason from its container's final state and the job's marks."""
    code = int(state["ExitCode"])
    failure = job_dir / "paiexp" / "failure"
    limit = (
        f"limit {format_size(resources.memory)}, {resources.source}"
        if resources.memory
        else "no memory limit"
    )
    if (job_dir / "stop").exists():
        started = timestamp(state["StartedAt"]) is not None
        return JobState.STOPPED, "stopped" if started else "stopped before it started"
    if failure.exists():
        return JobState.FAILED, failure.read_text().strip()
    if code == 0:
        return JobState.SUCCEEDED, ""
    if state.get("OOMKilled"):  # the engine's word: never a guess from a SIGKILL
        return JobState.FAILED, f"killed: out of memory ({limit})"
    return JobState.FAILED, failure_reason(code)


def timestamp(value: str) -> float | None:
    """An engine timestamp (RFC 3339, nanoseconds) as seconds; None for the zero time."""
    if value.startswith("0001-"):
        return None
    head, _, fraction = value.rstrip("Z").partition(".")
    stamp = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    return stamp.timestamp() + float(f"0.{fraction or 0}")


def killed_from_outside(
    client: Any, job_dir: Path, container_id: str, state: dict[str, Any]
) -> bool:
    """Whether a failed container was killed by someone other than paiexp (``docker kill``,
    the engine going down): the engine logged a ``kill`` of it, and neither paiexp's stop nor
    its time limit, nor the kernel's out-of-memory killer, ended it."""
    marked = (job_dir / "stop").exists() or (job_dir / "paiexp" / "failure").exists()
    started = timestamp(state["StartedAt"])
    if marked or state.get("OOMKilled") or started is None:
        return False
    ended = timestamp(state["FinishedAt"]) or started
    events = client.api.events(
        since=int(started),
        until=int(ended) + 1,
        filters={"container": container_id, "event": "kill"},
        decode=True,
    )
    return any(True for _ in events)
