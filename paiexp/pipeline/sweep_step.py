"""A sweep step: the sweep's launcher run as a single sweep would run, its parent run nested
under the pipeline's, and its best trial's parameters, values and outputs as its results.

Launching it again resumes the study (trials left running are adopted, finished ones kept):
a killed pipeline's sweep step goes on where it stopped.  The best is the study's own
(``study.best_trial``), whatever launch ran it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from paiexp.pipeline.execution import StepOutcome
from paiexp.pipeline.shapes import best_params
from paiexp.pipeline.state import StepStatus
from paiexp.sweep.launcher import Launcher
from paiexp.sweep.opening import PARENT_RUN_ATTR
from paiexp.sweep.prepared import PreparedSweep
from paiexp.sweep.progress import Progress, RunningSweep, print_summary
from paiexp.sweep.records import JOB_NAME
from paiexp.sweep.tracking import SweepTracker
from paiexp.sweep.tracking_messages import TrackingSetup

if TYPE_CHECKING:
    from optuna import Study

    from paiexp.pipeline.tracking import PipelineRuns


class StepSweepTracker(SweepTracker):
    """The sweep's tracker, its parent run tagged as the pipeline's step (and its child)."""

    def __init__(self, setup: TrackingSetup, tags: Mapping[str, str]) -> None:
        super().__init__(setup)
        self.step_tags = dict(tags)

    def open_parent(
        self,
        sweep_id: str,
        known_run_id: str | None,
        create: Mapping[str, Any],
        invocation: Mapping[str, str],
        **options: Any,
    ) -> None:
        create = {**create, "tags": {**create["tags"], **self.step_tags}}
        invocation = {**invocation, **self.step_tags}
        super().open_parent(sweep_id, known_run_id, create, invocation, **options)


class StepProgress(Progress):
    """A sweep step's terminal output; :meth:`interrupt` reaches its running scheduler."""

    def __init__(self, step: str, prepared: PreparedSweep) -> None:
        super().__init__(prepared.sweep.n_trials, prepared.objectives)
        self.step = step
        self.scheduler: Any = None
        self.interrupted = False

    @contextmanager
    def live(self, sweep: RunningSweep) -> Iterator[None]:
        self.scheduler = sweep  # the launcher's Scheduler
        if self.interrupted:
            self.scheduler.interrupt()
        try:
            with super().live(sweep):
                yield
        finally:
            self.scheduler = None

    def say(self, message: str) -> None:
        super().say(f"step {self.step}: {message}")

    def interrupt(self) -> None:
        self.interrupted = True
        if self.scheduler is not None:
            self.scheduler.interrupt()


class SweepStep:
    def __init__(self, name: str, prepared: PreparedSweep, runs: PipelineRuns, digest: str):
        self.name = name
        self.prepared = prepared
        self.runs = runs
        self.digest = digest
        self.progress = StepProgress(name, prepared)

    def run(self) -> StepOutcome:
        prepared = self.prepared

        def tracker(setup: TrackingSetup) -> StepSweepTracker:
            return StepSweepTracker(setup, self.runs.step_tags(self.name, self.digest))

        launcher = Launcher(prepared, self.progress, tracker)
        outcome = launcher.run()
        print_summary(
            self.progress.console,
            outcome,
            prepared.objectives,
            prepared.storage,
            prepared.study_name,
            prepared.base_dir,
        )
        study = outcome.study
        run_id = study.user_attrs.get(PARENT_RUN_ATTR)
        complete = _complete(study)
        results: dict[str, Any] = {
            "status": StepStatus.succeeded.value,
            "run_id": run_id,
            "study_name": prepared.study_name,
            "n_complete": len(complete),
        }
        if outcome.interrupted:
            status, note = StepStatus.stopped, "interrupted"
        elif outcome.failed or not complete:
            status, note = StepStatus.failed, outcome.stop_reason or "no trial completed"
        else:
            status, note = StepStatus.succeeded, None
        results["status"] = status.value
        if complete and len(prepared.objectives) == 1:
            results["best"] = self.best(study)
        return StepOutcome(status, results, run_id, note)

    def best(self, study: Study) -> dict[str, Any]:
        """The study's best trial: its parameters (fixed ones too), values, job and run."""
        trial = study.best_trial
        job_name = trial.user_attrs.get(JOB_NAME)
        run = self.runs.tracker.find_run(job_name) if job_name else None
        backend = self.prepared.backend
        handle = backend.find(job_name) if job_name else None
        objectives = self.prepared.objectives
        return {
            "params": best_params(self.prepared.trials.values(trial.params)),
            "value": trial.values[0],
            "values": {o.metric: v for o, v in zip(objectives, trial.values, strict=True)},
            "trial": trial.number,
            "job_name": job_name,
            "run_id": run.run_id if run else None,
            "outputs": backend.outputs(handle) if handle else {},
        }

    def stop(self) -> None:
        self.progress.interrupt()


def _complete(study: Study) -> list[Any]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
