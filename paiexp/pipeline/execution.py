"""What running a step gives the pipeline: an outcome, and a way to stop it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from paiexp.pipeline.state import StepStatus


@dataclass(frozen=True)
class StepOutcome:
    status: StepStatus
    results: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    note: str | None = None  # why it did not succeed


class StepExecution(Protocol):
    def run(self) -> StepOutcome:
        """Run the step (or follow it again) to its end; called in a thread of its own."""

    def stop(self) -> None:
        """Ask the step to stop (Ctrl-C): its jobs are stopped, it ends ``stopped``."""
