"""MLflow for a sweep: one parent run per study, one child run per trial.

Child runs are created synchronously (their id is recorded in the trial before its job is
submitted); everything else goes through :class:`TrackingWorker`, one background thread that
applies MLflow calls in order, so a finished trial's slot is refilled without waiting for
MLflow.  A launcher that dies loses at most queued calls; resume re-applies them.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
WORKER_NICENESS = 10
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
        # Bookkeeping yields the CPU to the launch loop and to starting jobs (a Linux thread
        # has its own nice value).
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICENESS)
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
    """The sweep's MLflow side. Every call runs on the worker, in order, MLflow's import and
    the opening of its store included: the launcher never waits for MLflow, and the first
    trials run while it starts.  ``fatal`` tells the launcher when tracking cannot work.
    """

    def __init__(self, open_tracker: Callable[[], MlflowTracker]) -> None:
        self.worker = TrackingWorker()
        self.fatal: str | None = None
        self.parent_run_id = ""
        self.runs: dict[str, str] = {}  # job name -> run id
        self._best_run_id: str | None = None
        self._tracker: MlflowTracker | None = None
        self.submit(lambda: None, opener=open_tracker)

    @property
    def tracker(self) -> MlflowTracker:
        assert self._tracker is not None, "only on the worker, after the tracker opened"
        return self._tracker

    def submit(
        self,
        call: Callable[[], None],
        opener: Callable[[], MlflowTracker] | None = None,
    ) -> None:
        """Queue ``call`` on the worker; skipped once tracking has failed for good."""

        def guarded() -> None:
            if self.fatal:
                return
            try:
                if opener is not None:
                    self._tracker = opener()
                call()
            except Exception as exc:
                if opener is not None or not self.parent_run_id:
                    self.fatal = f"{exc}"
                raise

        self.worker.submit(guarded)

    def close(self) -> str | None:
        """Wait for every queued call; returns the tracking URI, if tracking ever opened."""
        self.worker.close()
        return self._tracker.uri if self._tracker else None

    # -- parent ----------------------------------------------------------------------------

    def open_parent(
        self,
        sweep_id: str,
        known_run_id: str | None,
        create: Mapping[str, Any],
        invocation: Mapping[str, str],
        remember: Callable[[str], None],
    ) -> None:
        """Find or create the study's parent run and mark it RUNNING again."""

        def call() -> None:
            run_id = self._parent_run(sweep_id, known_run_id, create)
            if run_id != known_run_id:
                remember(run_id)
            self.tracker.client.update_run(run_id, status="RUNNING")
            self.tracker.set_tags(run_id, invocation)
            self.parent_run_id = run_id

        self.submit(call)

    def _parent_run(
        self, sweep_id: str, known_run_id: str | None, create: Mapping[str, Any]
    ) -> str:
        """The recorded parent run, else the one tagged with the sweep id, else a new one."""
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        client, experiment_id = self.tracker.client, self.tracker.experiment_id
        if known_run_id:
            try:
                if client.get_run(known_run_id).info.experiment_id == experiment_id:
                    return known_run_id
            except MlflowException:
                pass
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{SWEEP_ID_TAG}` = '{sweep_id}'",
            max_results=1,
        )
        if found:
            return str(found[0].info.run_id)
        run = client.create_run(
            experiment_id,
            run_name=str(create["study_name"]),
            tags={SWEEP_ID_TAG: sweep_id, "paiexp.kind": "sweep", **create["tags"]},
        )
        params = [Param(k, str(v)[:6000]) for k, v in create["params"].items()]
        client.log_batch(run.info.run_id, params=params)
        return str(run.info.run_id)

    def update_best(
        self,
        metrics: Mapping[str, float],
        step: int,
        tags: Mapping[str, str],
        best_job: str | None,
    ) -> None:
        def call() -> None:
            from mlflow.entities import Metric, RunTag

            client = self.tracker.client
            now = _now_ms()
            client.log_batch(
                self.parent_run_id,
                metrics=[Metric(k, v, now, step) for k, v in metrics.items()],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
            best_run_id = self.runs.get(best_job) if best_job else None
            if best_run_id and best_run_id != self._best_run_id:
                if self._best_run_id:
                    client.set_tag(self._best_run_id, "paiexp.best", "false")
                client.set_tag(best_run_id, "paiexp.best", "true")
                self._best_run_id = best_run_id

        self.submit(call)

    def finish_parent(self, study: Any, *, interrupted: bool) -> None:
        """Plots and the trials table as artifacts; then close the parent run.

        An interrupted launch closes it KILLED at once; the next full launch draws the plots.
        """

        def call() -> None:
            client = self.tracker.client
            if not interrupted:
                with tempfile.TemporaryDirectory() as directory:
                    for artifact_dir, path in _study_artifacts(study, Path(directory)):
                        client.log_artifact(self.parent_run_id, str(path), artifact_dir)
            client.set_terminated(
                self.parent_run_id, status="KILLED" if interrupted else "FINISHED"
            )

        self.submit(call)

    # -- children --------------------------------------------------------------------------
    # A child run is found by its job name (a tag), which the trial records before its job
    # exists; so runs are created off the launcher's path, on the worker.

    def children(self) -> dict[str, tuple[str, str]]:
        """The parent's child runs: job name -> (run id, status). On the worker."""
        found = self.tracker.client.search_runs(
            [self.tracker.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_run_id}'",
            max_results=50000,
        )
        return {
            r.data.tags.get("paiexp.job_name", ""): (str(r.info.run_id), str(r.info.status))
            for r in found
        }

    def start_child(
        self,
        job_name: str,
        make_record: Callable[[], RunRecord],
        tags: Mapping[str, str],
        *,
        adopted: bool = False,
    ) -> None:
        """Create a trial's run (an adopted trial's may exist: reuse it) and log its record."""

        def call() -> None:
            record = make_record()
            existing = self.children().get(job_name, (None, ""))[0] if adopted else None
            run_id = existing or self.tracker.create_run(
                record,
                run_name=str(tags.get("mlflow.runName", job_name)),
                parent_run_id=self.parent_run_id,
                extra_tags=tags,
            )
            self.runs[job_name] = run_id
            self.tracker.log_record(run_id, record)

        self.submit(call)

    def finish_child(self, job_name: str, finish: Callable[[MlflowTracker, str], None]) -> None:
        """Close a trial's run (after :meth:`start_child`, on the same worker)."""
        self.submit(lambda: finish(self.tracker, self.runs[job_name]))


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
