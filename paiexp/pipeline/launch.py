"""``python -m paiexp +pipeline=NAME [--rerun STEP]...``: check, lock, run, summarize."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from paiexp.compose import Project
from paiexp.pipeline.prepare import PreparedPipeline, prepare_pipeline
from paiexp.pipeline.resume import check_state, start_again
from paiexp.pipeline.runner import PipelineOutcome, PipelineRunner
from paiexp.pipeline.tracking import PipelineRuns
from paiexp.terminal import say

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def run_pipeline(
    project: Project, overrides: Sequence[str], cfg: DictConfig, rerun: Sequence[str], quiet: bool
) -> int:
    prepared = prepare_pipeline(project, overrides, cfg)  # every check; nothing created yet
    check_state(prepared, rerun)
    prepared.state.lock()
    prepared.state.reload()  # as the launcher before this one left it
    start_again(prepared, check_state(prepared, rerun))
    prepared.state.save()

    runs = PipelineRuns(prepared.tracker, prepared)  # MLflow opens when first needed
    runner = PipelineRunner(prepared, runs, echo=None if quiet else print, say=say)
    outcome = runner.run()
    runs.close(outcome.statuses, interrupted=outcome.interrupted)
    summarize(prepared, outcome, prepared.state.run_id, runs.uri)
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if outcome.failed else 0


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
