"""MLflow for a sweep: one parent run per study, one child run per trial.

All of it runs in a child process, fed plain data (records, results, best values) through a
queue, in order.  The launcher never imports MLflow, never waits for it and never shares an
interpreter lock with it: MLflow's seconds of start-up overlap the first trials without
delaying them.  The child dies with the launcher (a crash loses at most queued calls, which
the next launch reconciles) and ignores Ctrl-C, so an interrupted sweep still closes its runs.
Child runs are found again by their job name (a tag), which a trial records before its job
exists.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paiexp.metrics import MetricPoint
from paiexp.monitor import JobMonitor, JobResult
from paiexp.record import SourceInfo, make_record
from paiexp.spec import JobSpec

log = logging.getLogger(__name__)

SWEEP_ID_TAG = "paiexp.sweep_id"
PARENT_RUN_ATTR = "paiexp:parent_run_id"
WORKER_NICENESS = 10
TRIAL_STATE_TO_RUN_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "KILLED"}


@dataclass(frozen=True)
class TrackingSetup:
    """What the tracking process needs to know of the sweep."""

    tracker_uri: str | None
    experiment: str
    storage: str
    study_name: str
    backend: Any  # the backend's config, to read finished jobs when reconciling
    base_dir: Path
    overrides: tuple[str, ...]
    source: SourceInfo | None


@dataclass(frozen=True)
class TrialRecord:
    """What a trial's run records: its job and its resolved config."""

    spec: JobSpec
    data: dict[str, Any]


class SweepTracker:
    """The launcher's handle on the tracking process. ``fatal`` says when tracking cannot
    work (the launcher then stops submitting)."""

    def __init__(self, setup: TrackingSetup) -> None:
        context = multiprocessing.get_context("spawn")
        self._calls: Any = context.Queue()
        self._replies: Any = context.Queue()
        self._process = context.Process(
            target=serve,
            args=(setup, self._calls, self._replies, os.getpid()),
            name="paiexp-tracking",
            daemon=True,
        )
        self._process.start()
        self._fatal: str | None = None
        self._run_ids: dict[str, str] = {}
        self.errors: list[str] = []
        self.uri: str | None = None

    def _send(self, name: str, **kwargs: Any) -> None:
        self._calls.put((name, kwargs))

    @property
    def fatal(self) -> str | None:
        self._read_replies()
        return self._fatal

    @property
    def run_ids(self) -> dict[str, str]:
        """Job name -> the id of its trial's run, for the runs created so far."""
        self._read_replies()
        return self._run_ids

    def _read_replies(self, *, block: bool = False) -> None:
        while True:
            try:
                kind, text = self._replies.get(block=block, timeout=None)
            except queue.Empty:
                return
            if kind == "fatal":
                self._fatal = text
                self.errors.append(text)
            elif kind == "error":
                self.errors.append(text)
            elif kind == "run":
                job_name, _, run_id = text.partition("\t")
                self._run_ids[job_name] = run_id
            elif kind == "closed":
                self.uri = text
                return

    def open_parent(
        self,
        sweep_id: str,
        known_run_id: str | None,
        create: Mapping[str, Any],
        invocation: Mapping[str, str],
    ) -> None:
        self._send(
            "open_parent",
            sweep_id=sweep_id,
            known_run_id=known_run_id,
            create=dict(create),
            invocation=dict(invocation),
        )

    def reconcile(self, trials: list[dict[str, Any]]) -> None:
        self._send("reconcile", trials=trials)

    def start_child(
        self, job_name: str, record: TrialRecord, tags: Mapping[str, str], *, adopted: bool = False
    ) -> None:
        self._send(
            "start_child", job_name=job_name, record=record, tags=dict(tags), adopted=adopted
        )

    def finish_child(
        self,
        job_name: str,
        result: JobResult,
        unlogged: list[MetricPoint],
        status: str,
        reason: str | None,
        tags: Mapping[str, str],
    ) -> None:
        self._send(
            "finish_child",
            job_name=job_name,
            result=result,
            unlogged=unlogged,
            status=status,
            reason=reason,
            tags=dict(tags),
        )

    def fail_child(self, job_name: str, reason: str) -> None:
        self._send("fail_child", job_name=job_name, reason=reason)

    def update_best(
        self, metrics: Mapping[str, float], step: int, tags: Mapping[str, str], best_job: str | None
    ) -> None:
        self._send(
            "update_best", metrics=dict(metrics), step=step, tags=dict(tags), best_job=best_job
        )

    def finish_parent(self, *, interrupted: bool) -> None:
        self._send("finish_parent", interrupted=interrupted)

    def close(self) -> str | None:
        """Wait until every queued call is done; returns the tracking URI, if it opened."""
        self._send("close")
        self._read_replies(block=True)
        self._process.join()
        return self.uri


def serve(setup: TrackingSetup, calls: Any, replies: Any, launcher_pid: int) -> None:
    """The tracking process: applies the launcher's calls in order until ``close``."""
    _die_with(launcher_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICENESS)  # bookkeeping yields the CPU to starting jobs
    server = _Server(setup)
    warmed = False
    while True:
        try:  # when idle, import what the end-of-sweep plots need (never ahead of a call)
            name, kwargs = calls.get(timeout=None if warmed or not server.opened else 0.5)
        except queue.Empty:
            warmed = True
            with contextlib.suppress(Exception):
                server.warm_up()
            continue
        if name == "close":
            replies.put(("closed", server.tracker.uri if server.opened else None))
            return
        if server.fatal:
            continue
        try:
            getattr(server, name)(**kwargs)
            if name == "start_child":  # the launcher labels the trial's job with its run
                job_name = kwargs["job_name"]
                replies.put(("run", f"{job_name}\t{server.runs[job_name]}"))
        except Exception as exc:  # tracking must never take the sweep down
            text = f"{name}: {exc}"
            if not server.parent_run_id:  # nothing can be tracked without a parent run
                server.fatal = text
                replies.put(("fatal", text))
            else:
                replies.put(("error", text))
                log.warning("MLflow tracking call failed: %s", text)


def _die_with(launcher_pid: int) -> None:
    """Be killed with the launcher (Linux), as a thread would be: a launcher killed with
    SIGKILL must not leave this process writing runs the next launch also writes."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != launcher_pid:
        os._exit(0)


class _Server:
    def __init__(self, setup: TrackingSetup) -> None:
        self.setup = setup
        self.fatal: str | None = None
        self.parent_run_id = ""
        self.runs: dict[str, str] = {}  # job name -> run id
        self._best_run_id: str | None = None
        self._tracker: Any = None
        self._study: Any = None

    @property
    def opened(self) -> bool:
        return self._tracker is not None

    @property
    def tracker(self) -> Any:
        if self._tracker is None:
            from paiexp.tracking import MlflowTracker

            self._tracker = MlflowTracker(self.setup.tracker_uri, self.setup.experiment)
        return self._tracker

    @property
    def study(self) -> Any:
        if self._study is None:
            import optuna

            from paiexp.sweep.study import create_storage

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            self._study = optuna.load_study(
                study_name=self.setup.study_name, storage=create_storage(self.setup.storage)
            )
        return self._study

    def record(self, record: TrialRecord) -> Any:
        return make_record(
            record.data,
            record.spec,
            project_dir=self.setup.base_dir,
            overrides=self.setup.overrides,
            source=self.setup.source,
        )

    # -- parent ----------------------------------------------------------------------------

    def open_parent(
        self,
        sweep_id: str,
        known_run_id: str | None,
        create: dict[str, Any],
        invocation: dict[str, str],
    ) -> None:
        """Find or create the study's parent run and mark it RUNNING again."""
        run_id = self._parent_run(sweep_id, known_run_id, create)
        if run_id != known_run_id:
            self.study.set_user_attr(PARENT_RUN_ATTR, run_id)
        self.tracker.client.update_run(run_id, status="RUNNING")
        self.tracker.set_tags(run_id, invocation)
        self.parent_run_id = run_id

    def _parent_run(self, sweep_id: str, known_run_id: str | None, create: dict[str, Any]) -> str:
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

    def warm_up(self) -> None:
        """Import what the end-of-sweep plots need while trials run, not after."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
        import optuna.importance
        import optuna.visualization.matplotlib  # noqa: F401

    def update_best(
        self, metrics: dict[str, float], step: int, tags: dict[str, str], best_job: str | None
    ) -> None:
        import time

        from mlflow.entities import Metric, RunTag

        client = self.tracker.client
        now = int(time.time() * 1000)
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

    def finish_parent(self, interrupted: bool) -> None:
        """Plots and the trials table as artifacts; then close the parent run.

        An interrupted launch closes it KILLED at once; the next full launch draws the plots.
        """
        client = self.tracker.client
        if not interrupted:
            with tempfile.TemporaryDirectory() as directory:
                for artifact_dir, path in _study_artifacts(self.study, Path(directory)):
                    client.log_artifact(self.parent_run_id, str(path), artifact_dir)
        client.set_terminated(self.parent_run_id, status="KILLED" if interrupted else "FINISHED")

    # -- children --------------------------------------------------------------------------

    def children(self) -> dict[str, tuple[str, str]]:
        """The parent's child runs: job name -> (run id, status)."""
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
        self, job_name: str, record: TrialRecord, tags: dict[str, str], adopted: bool
    ) -> None:
        """Create a trial's run (an adopted trial's may exist: reuse it) and log its record."""
        full = self.record(record)
        existing = self.children().get(job_name, (None, ""))[0] if adopted else None
        run_id = existing or self.tracker.create_run(
            full,
            run_name=tags.get("mlflow.runName", job_name),
            parent_run_id=self.parent_run_id,
            extra_tags=tags,
        )
        self.runs[job_name] = run_id
        self.tracker.log_record(run_id, full)

    def finish_child(
        self,
        job_name: str,
        result: JobResult,
        unlogged: list[MetricPoint],
        status: str,
        reason: str | None,
        tags: dict[str, str],
    ) -> None:
        self.tracker.finish(
            self.runs[job_name],
            result,
            unlogged=unlogged,
            status=status,
            reason=reason,
            extra_tags=tags,
        )

    def fail_child(self, job_name: str, reason: str) -> None:
        self.tracker.fail(self.runs[job_name], reason)

    def reconcile(self, trials: list[dict[str, Any]]) -> None:
        """Give each trial that had finished before this launch a closed run: a crash may
        have dropped the calls that were queued for it."""
        from paiexp.backends import create_backend

        children = self.children()
        backend = create_backend(self.setup.backend, self.setup.base_dir)
        log_root = self.setup.base_dir / ".paiexp" / "logs"
        for trial in trials:
            name, record = trial["job_name"], trial["record"]
            run_id, status = children.get(name, (None, ""))
            if status in TRIAL_STATE_TO_RUN_STATUS.values():
                continue
            if run_id is None:
                full = self.record(record)
                run_id = self.tracker.create_run(
                    full,
                    run_name=f"trial-{trial['number']}",
                    parent_run_id=self.parent_run_id,
                    extra_tags=trial["tags"],
                )
                self.tracker.log_record(run_id, full)
            self.runs[name] = run_id
            handle = backend.find(name)
            if handle is None:
                self.tracker.fail(run_id, trial["reason"] or "the job was never submitted")
                continue
            monitor = JobMonitor(backend, handle, record.spec, log_root / f"{name}.log")
            job_status = backend.poll([handle])[handle.id]
            monitor.pull(final=True)
            self.tracker.finish(
                run_id,
                monitor.result(job_status),
                unlogged=monitor.take_unlogged(),
                status=TRIAL_STATE_TO_RUN_STATUS[trial["state"]],
                reason=trial["reason"],
                extra_tags={"paiexp.trial_state": trial["state"]},
            )


def _study_artifacts(study: Any, directory: Path) -> list[tuple[str, Path]]:
    """(artifact dir, file): every trial as CSV; optimization history and importances as PNG."""
    import warnings
    from collections.abc import Callable

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
