"""An earlier launch's state, checked against the pipeline before anything runs.

A step that succeeded is skipped later, and one that is running is followed again, only if
its config is still the one it ran with; otherwise the launch stops with a one-line error
naming the first key that changed, unless ``--rerun STEP`` asks for the step (and every step
after it) to run again, as a new attempt.
"""

from __future__ import annotations

from collections.abc import Sequence

from paiexp.errors import UserError
from paiexp.pipeline.naming import first_difference, redacted
from paiexp.pipeline.prepare import PreparedPipeline
from paiexp.pipeline.state import StepRecord, StepStatus


def check_state(prepared: PreparedPipeline, rerun: Sequence[str]) -> set[str]:
    """The steps to run again (``rerun`` and what depends on them); a UserError if the
    pipeline changed a step that succeeded or runs."""
    graph, state = prepared.graph, prepared.state
    for name in rerun:
        if name not in graph.steps:
            raise UserError(f"--rerun: unknown step {name!r}; steps: {', '.join(graph.steps)}")
    again = set(rerun).union(*(graph.descendants(name) for name in rerun))
    for name in sorted(again):
        record = state.steps.get(name)
        if record is not None and record.status is StepStatus.running:
            raise UserError(
                f"--rerun {name}: step {name} is still running ({record.handle}); run the "
                "same command without --rerun to follow it to its end first"
            )
    for name, step in graph.steps.items():
        record = state.steps.get(name)
        if name in again or record is None:
            continue
        if record.status not in (StepStatus.succeeded, StepStatus.running):
            continue
        done = "is running" if record.status is StepStatus.running else "succeeded"
        results = {}
        for dependency in sorted(graph.ancestors(name)):
            earlier = state.steps.get(dependency)
            if earlier is None or earlier.status is not StepStatus.succeeded:
                raise UserError(
                    f"pipeline.steps.{name}: the step {done} before {dependency} ran, which it "
                    f"now depends on; pass --rerun {name} to run it again"
                )
            results[dependency] = earlier.results
        current = prepared.preparer.prepare(step, results, record.attempt)
        if current.digest != record.digest:
            change = first_difference(record.config, redacted(current.data)) or "its config"
            advice = (
                f"pass --rerun {name} to run it (and the steps after it) again"
                if record.status is StepStatus.succeeded
                else "let it finish first (run the command that started it)"
            )
            raise UserError(
                f"pipeline.steps.{name}: changed since the step {done} ({change}); {advice}"
            )
    return again


def start_again(prepared: PreparedPipeline, again: set[str]) -> None:
    """Forget the outcome of the steps to run again; each gets a new attempt."""
    for name in again:
        record = prepared.state.steps.get(name)
        if record is not None:
            prepared.state.steps[name] = StepRecord(StepStatus.pending, record.attempt + 1)
