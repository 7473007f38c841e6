"""What a pipeline's launcher on the command line says at its end: each step's status."""

from __future__ import annotations

from paiexp.pipeline.prepare import PreparedPipeline
from paiexp.pipeline.runner import PipelineOutcome
from paiexp.util.terminal import say


def summarize(
    prepared: PreparedPipeline, outcome: PipelineOutcome, run_id: str | None, uri: str
) -> None:
    counts: dict[str, int] = {}
    for status in outcome.statuses.values():
        counts[status.value] = counts.get(status.value, 0) + 1
    said = ", ".join(f"{count} {status}" for status, count in counts.items())
    say(f"pipeline {prepared.graph.name}: {said}")
    width = max(len(name) for name in outcome.statuses)
    for name in prepared.graph.steps:
        status = outcome.statuses[name]
        note = outcome.notes.get(name)
        say(f"  {name:<{width}}  {status.value:<9}" + (f"  {note}" if note else ""))
    say(f"  MLflow run {run_id}; browse with: mlflow ui --backend-store-uri {uri}")
