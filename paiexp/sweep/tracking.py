"""MLflow for a sweep: one parent run per study, one child run per trial.

Child runs are created synchronously (their id is recorded in the trial before its job is
submitted); everything else goes through :class:`TrackingWorker`, one background thread that
applies MLflow calls in order, so a finished trial's slot is refilled without waiting for
MLflow.  A launcher that dies loses at most queued calls; resume re-applies them.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from paiexp.record import RunRecord
from paiexp.tracking import MlflowTracker

log = logging.getLogger(__name__)

SWEEP_ID_TAG = "paiexp.sweep_id"
TRIAL_STATE_TO_RUN_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "KILLED"}


class TrackingWorker:
    """Runs tracking calls one after another on a background thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._work, name="paiexp-tracking", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], None]) -> None:
        self._queue.put(call)

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            try:
                if call is None:
                    return
                call()
            except Exception as exc:  # tracking must never take the sweep down
                self.errors.append(repr(exc))
                log.warning("MLflow tracking call failed: %r", exc)
            finally:
                self._queue.task_done()


class SweepTracker:
    def __init__(self, tracker: MlflowTracker) -> None:
        self.tracker = tracker
        self.client = tracker.client
        self.worker = TrackingWorker()
        self._best_run_id: str | None = None
        self.runs: dict[str, str] = {}  # job name -> run id, filled by the worker

    # -- parent ----------------------------------------------------------------------------

    def parent_run(self, sweep_id: str, known_run_id: str | None, create: Mapping[str, Any]) -> str:
        """The study's parent run: the recorded one, else one tagged with the sweep id, else new."""
        from mlflow.exceptions import MlflowException

        if known_run_id:
            try:
                run = self.client.get_run(known_run_id)
                if run.info.experiment_id == self.tracker.experiment_id:
                    return known_run_id
            except MlflowException:
                pass
        found = self.client.search_runs(
            [self.tracker.experiment_id],
            filter_string=f"tags.`{SWEEP_ID_TAG}` = '{sweep_id}'",
            max_results=1,
        )
        if found:
            return str(found[0].info.run_id)
        from mlflow.entities import Param

        run = self.client.create_run(
            self.tracker.experiment_id,
            run_name=str(create["study_name"]),
            tags={SWEEP_ID_TAG: sweep_id, "paiexp.kind": "sweep", **create["tags"]},
        )
        params = [Param(k, str(v)[:6000]) for k, v in create["params"].items()]
        self.client.log_batch(run.info.run_id, params=params)
        return str(run.info.run_id)

    def resume_parent(self, run_id: str, tags: Mapping[str, str]) -> None:
        self.client.update_run(run_id, status="RUNNING")
        self.tracker.set_tags(run_id, tags)

    def update_best(
        self,
        parent_run_id: str,
        metrics: Mapping[str, float],
        step: int,
        tags: Mapping[str, str],
        best_job: str | None,
    ) -> None:
        def call() -> None:
            from mlflow.entities import Metric, RunTag

            best_run_id = self.runs.get(best_job) if best_job else None
            now = _now_ms()
            self.client.log_batch(
                parent_run_id,
                metrics=[Metric(k, v, now, step) for k, v in metrics.items()],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
            if best_run_id and best_run_id != self._best_run_id:
                if self._best_run_id:
                    self.client.set_tag(self._best_run_id, "paiexp.best", "false")
                self.client.set_tag(best_run_id, "paiexp.best", "true")
                self._best_run_id = best_run_id

        self.worker.submit(call)

    def finish_parent(self, parent_run_id: str, study: Any, status: str) -> None:
        """Plots and the trials table as artifacts; then close the parent run."""
        self.worker.flush()
        with tempfile.TemporaryDirectory() as directory:
            for artifact_dir, path in _study_artifacts(study, Path(directory)):
                self.client.log_artifact(parent_run_id, str(path), artifact_dir)
        self.client.set_terminated(parent_run_id, status=status)

    # -- children --------------------------------------------------------------------------
    # A child run is found by its job name (a tag), which the trial records before its job
    # exists; so runs can be created off the launcher's path, on the worker.

    def children(self, parent_run_id: str) -> dict[str, tuple[str, str]]:
        """The parent's child runs: job name -> (run id, status)."""
        found = self.client.search_runs(
            [self.tracker.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
            max_results=50000,
        )
        return {
            r.data.tags.get("paiexp.job_name", ""): (str(r.info.run_id), str(r.info.status))
            for r in found
        }

    def start_child(
        self,
        parent_run_id: str,
        job_name: str,
        make_record: Callable[[], RunRecord],
        tags: Mapping[str, str],
        *,
        existing: str | None = None,
    ) -> None:
        """Create (or, for ``existing``, reuse) a trial's run and log its record, on the worker."""

        def call() -> None:
            record = make_record()
            run_id = existing or self.tracker.create_run(
                record,
                run_name=str(tags.get("mlflow.runName", job_name)),
                parent_run_id=parent_run_id,
                extra_tags=tags,
            )
            self.runs[job_name] = run_id
            self.tracker.log_record(run_id, record)

        self.worker.submit(call)

    def finish_child(self, job_name: str, finish: Callable[[MlflowTracker, str], None]) -> None:
        """Close a trial's run (after :meth:`start_child`, on the same worker)."""
        self.worker.submit(lambda: finish(self.tracker, self.runs[job_name]))


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _study_artifacts(study: Any, directory: Path) -> list[tuple[str, Path]]:
    """(artifact dir, file): every trial as CSV; optimization history and importances as PNG."""
    import optuna
    from optuna.trial import TrialState

    trials_csv = directory / "trials.csv"
    study.trials_dataframe().to_csv(trials_csv, index=False)
    artifacts = [("study", trials_csv)]
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return artifacts
    import matplotlib

    matplotlib.use("Agg")
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    import matplotlib.pyplot as plt

    plot = optuna.visualization.matplotlib
    for index in range(len(study.directions)):
        multi = len(study.directions) > 1
        target = (lambda t, i=index: t.values[i]) if multi else None
        name = f"objective {index}" if multi else "Objective Value"
        suffix = f"_{index}" if multi else ""
        drawings: dict[str, Callable[..., Any]] = {
            f"optimization_history{suffix}": plot.plot_optimization_history
        }
        if len(complete) >= 2:
            drawings[f"param_importances{suffix}"] = plot.plot_param_importances
        for stem, draw in drawings.items():
            try:
                axes = draw(study, target=target, target_name=name)
            except (ValueError, RuntimeError) as exc:  # e.g. importances of a constant objective
                log.info("skipping plot %s: %s", stem, exc)
                continue
            figure = axes.get_figure(root=True)
            assert figure is not None
            figure.set_size_inches(9, 6)
            figure.tight_layout()
            path = directory / f"{stem}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            artifacts.append(("plots", path))
    return artifacts
