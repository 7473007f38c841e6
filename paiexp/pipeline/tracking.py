"""A pipeline in MLflow: one parent run per pipeline, each step a child run under it.

A job step's run is its job's run; a sweep step's is its sweep's parent run (the trials
nested under it); a skipped step gets a run of tags saying which condition skipped it and
the values it saw.  The parent run is found again by the pipeline's id, so a relaunch adds no
run.  Every MLflow call goes through :class:`paiexp.tracking.MlflowTracker`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from paiexp.pipeline.state import StepStatus
from paiexp.redact import redact_override
from paiexp.tracking import PARENT_RUN_TAG

if TYPE_CHECKING:
    from paiexp.pipeline.prepare import PreparedPipeline
    from paiexp.tracking import MlflowTracker

PIPELINE_ID_TAG = "paiexp.pipeline_id"
STEP_TAG = "paiexp.pipeline_step"
STEP_STATUS_TAG = "paiexp.step_status"


class PipelineRuns:
    def __init__(self, tracker: MlflowTracker, prepared: PreparedPipeline) -> None:
        self.tracker = tracker
        self.prepared = prepared
        self.parent = ""

    def open(self) -> str:
        """The pipeline's parent run (found again, or created), marked RUNNING."""
        state = self.prepared.state
        known = self.tracker.get_run(state.run_id) if state.run_id else None
        if known is not None and known.experiment_id == self.tracker.experiment_id:
            run_id = known.run_id
        else:
            found = self.tracker.find_tagged_run(PIPELINE_ID_TAG, state.pipeline_id)
            run_id = found.run_id if found else self._create()
        self.tracker.set_status(run_id, "RUNNING")
        self.parent = run_id
        return run_id

    def _create(self) -> str:
        graph = self.prepared.graph
        tags = {
            PIPELINE_ID_TAG: self.prepared.state.pipeline_id,
            "paiexp.kind": "pipeline",
            "paiexp.pipeline": graph.name,
            "paiexp.steps": ", ".join(
                f"{s.name} <- {'+'.join(s.depends)}" if s.depends else s.name
                for s in graph.steps.values()
            ),
            "paiexp.project_dir": str(self.prepared.preparer.base_dir),
            "paiexp.overrides": " ".join(map(redact_override, self.prepared.overrides)),
        }
        run_id = self.tracker.create_tagged_run(graph.name, tags)
        if self.prepared.source.is_file():
            self.tracker.log_artifact(run_id, self.prepared.source, "pipeline")
        return run_id

    def step_tags(self, step: str, digest: str) -> dict[str, str]:
        """What each step's run carries: its place in the pipeline and its config's digest."""
        return {
            PARENT_RUN_TAG: self.parent,
            PIPELINE_ID_TAG: self.prepared.state.pipeline_id,
            "paiexp.pipeline": self.prepared.graph.name,
            STEP_TAG: step,
            "paiexp.step_digest": digest,
        }

    def skipped(self, step: str, why: str, seen: Mapping[str, Any]) -> str:
        """A closed run recording a step that did not run: the reason and the values seen."""
        tags = {
            PARENT_RUN_TAG: self.parent,
            PIPELINE_ID_TAG: self.prepared.state.pipeline_id,
            "paiexp.pipeline": self.prepared.graph.name,
            STEP_TAG: step,
            STEP_STATUS_TAG: StepStatus.skipped.value,
            "paiexp.skip_reason": why,
        }
        when = self.prepared.graph.steps[step].when
        if when is not None and seen:
            tags["paiexp.when"] = when.text
            tags["paiexp.when_values"] = "; ".join(f"{k} = {v!r}" for k, v in seen.items())
        run_id = self.tracker.create_tagged_run(step, tags)
        self.tracker.terminate(run_id, "FINISHED")
        return run_id

    def step_ended(self, run_id: str | None, status: StepStatus) -> None:
        if run_id:
            self.tracker.set_tags(run_id, {STEP_STATUS_TAG: status.value})

    def close(self, statuses: Mapping[str, StepStatus], *, interrupted: bool) -> None:
        tags = {f"paiexp.step.{name}": status.value for name, status in statuses.items()}
        self.tracker.set_tags(self.parent, tags)
        failed = any(not status.ok for status in statuses.values())
        run_status = "KILLED" if interrupted else "FAILED" if failed else "FINISHED"
        self.tracker.terminate(self.parent, run_status)
