"""A pipeline in MLflow: one parent run per pipeline, each step a child run under it.

A job step's run is its job's run; a sweep step's is its sweep's parent run (the trials
nested under it); a skipped step gets a run of tags saying which condition skipped it and
the values it saw.  The parent run is found again by the pipeline's id, so a relaunch adds no
run.  Every MLflow call goes through :class:`paiexp.tracking.mlflow_tracker.MlflowTracker`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from paiexp.pipeline.state import StepStatus
from paiexp.tracking.mlflow_tracker import PARENT_RUN_TAG, STEP_TAG, tracking_uri
from paiexp.util.redact import redact_override

if TYPE_CHECKING:
    from paiexp.config.schema import TrackerConfig
    from paiexp.pipeline.prepare import PreparedPipeline
    from paiexp.tracking.mlflow_tracker import MlflowTracker

PIPELINE_ID_TAG = "paiexp.pipeline_id"  # the parent run's only
STEP_STATUS_TAG = "paiexp.step_status"


class PipelineRuns:
    """The pipeline's runs, with MLflow opened on first use (in whichever step's thread needs
    it first): a job step submits its job before that, so MLflow's start-up overlaps the job,
    and a launch that finds nothing to do never imports MLflow."""

    def __init__(self, config: TrackerConfig, prepared: PreparedPipeline) -> None:
        self.config = config
        self.prepared = prepared
        self.parent = ""
        self._tracker: MlflowTracker | None = None
        self._opening = threading.Lock()

    @property
    def tracker(self) -> MlflowTracker:
        return self.open()

    def open(self) -> MlflowTracker:
        """The tracker, the pipeline's parent run found again (or created), marked RUNNING."""
        with self._opening:
            if self._tracker is None:
                from paiexp.tracking.mlflow_tracker import MlflowTracker

                tracker = MlflowTracker(self.config.uri, self.config.experiment)
                self.parent = self._open(tracker)
                self._tracker = tracker
            return self._tracker

    @property
    def uri(self) -> str:
        return tracking_uri(self.config.uri)

    def _open(self, tracker: MlflowTracker) -> str:
        state = self.prepared.state
        known = tracker.get_run(state.run_id) if state.run_id else None
        if known is not None and known.experiment_id == tracker.experiment_id:
            run_id = known.run_id
        else:
            found = tracker.find_tagged_run(PIPELINE_ID_TAG, state.pipeline_id)
            run_id = found.run_id if found else self._create(tracker)
        tracker.set_status(run_id, "RUNNING")
        state.run_id, state.closed_as = run_id, None
        state.save()
        return run_id

    def _create(self, tracker: MlflowTracker) -> str:
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
        # named apart from the sweep of the same name (+sweep=xgb's parent run is "xgb")
        run_id = tracker.create_tagged_run(f"pipeline-{graph.name}", tags)
        if self.prepared.source.is_file():
            tracker.log_artifact(run_id, self.prepared.source, "pipeline")
        return run_id

    def step_tags(self, step: str, digest: str) -> dict[str, str]:
        """What each step's run carries: its place in the pipeline and its config's digest."""
        self.open()
        return {
            PARENT_RUN_TAG: self.parent,
            "paiexp.pipeline": self.prepared.graph.name,
            STEP_TAG: step,
            "paiexp.step_digest": digest,
        }

    def skipped(self, step: str, why: str, seen: Mapping[str, Any]) -> str:
        """A closed run recording a step that did not run: the reason and the values seen."""
        tracker = self.open()
        tags = {
            PARENT_RUN_TAG: self.parent,
            "paiexp.pipeline": self.prepared.graph.name,
            STEP_TAG: step,
            STEP_STATUS_TAG: StepStatus.skipped.value,
            "paiexp.skip_reason": why,
        }
        when = self.prepared.graph.steps[step].when
        if when is not None and seen:
            tags["paiexp.when"] = when.text
            tags["paiexp.when_values"] = "; ".join(f"{k} = {v!r}" for k, v in seen.items())
        run_id = tracker.create_tagged_run(step, tags)
        tracker.terminate(run_id, "FINISHED")
        return run_id

    def step_ended(self, run_id: str | None, status: StepStatus) -> None:
        if run_id:
            self.tracker.set_tags(run_id, {STEP_STATUS_TAG: status.value})

    def close(self, statuses: Mapping[str, StepStatus], *, interrupted: bool) -> None:
        """Close the parent run with the launch's outcome (untouched when this launch did
        nothing and it was closed so already)."""
        failed = any(not status.ok for status in statuses.values())
        run_status = "KILLED" if interrupted else "FAILED" if failed else "FINISHED"
        state = self.prepared.state
        if self._tracker is None and state.closed_as == run_status:
            return
        tracker = self.open()
        tags = {f"paiexp.step.{name}": status.value for name, status in statuses.items()}
        tracker.set_tags(self.parent, tags)
        tracker.terminate(self.parent, run_status)
        state.closed_as = run_status
        state.save()
