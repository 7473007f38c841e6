"""The Python API's sweeps: launched as the command line launches them (the same crash-safe
launcher, a detached process of its own, so a notebook kernel's restart does not end the
sweep), or attached to wherever they were started; progress, stop, resume, results as a
DataFrame while the sweep runs, and the best trial with its model.

Cheap to import: Optuna, MLflow and pandas load when a sweep is launched or read.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paiexp._jobs import Job, attach_job, compose_project, reader, user_errors
from paiexp._launch import launch_detached
from paiexp.errors import UserError

if TYPE_CHECKING:
    import pandas
    from optuna import Study

POLL_SECONDS = 1.0  # how often wait() looks at a sweep another process runs
OPEN_SECONDS = 120.0  # how long a new launcher may take to open its study
RESULT_TAGS = ("paiexp.job_name", "paiexp.model_uri", "paiexp.trial_number")


@dataclass(frozen=True)
class Best:
    """A best trial (or one of a Pareto front): its point, value(s), run and model."""

    number: int
    params: dict[str, Any]
    values: dict[str, float]
    run_id: str | None
    model_uri: str | None
    tracker_uri: str = field(repr=False)

    @property
    def value(self) -> float:
        """The objective's value (a study of one objective)."""
        (only,) = self.values.values()
        return only

    def job(self) -> Job:
        """The trial's job handle: its metrics, log, outputs, ``download``."""
        if self.run_id is None:
            raise UserError(f"best: trial {self.number} has no MLflow run (yet)")
        return attach_job(self.run_id, tracker_uri=self.tracker_uri)


@dataclass
class Sweep:
    """A study and its MLflow runs; its launcher too, when this process started it."""

    study_name: str
    storage: str  # a journal file's path, or an RDB URL
    tracker_uri: str
    overrides: tuple[str, ...] = ()
    base_dir: Path = field(default_factory=Path.cwd)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log_path: Path | None = None  # the launcher's output, when this process started it

    # -- progress --------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Trials by state, as the command line's status line counts them: ``complete``,
        ``pruned``, ``failed`` (counted toward n_trials), ``rerun`` (failed, run again),
        ``running``."""
        from paiexp.sweep.records import RETRIED

        counts = dict.fromkeys(("complete", "pruned", "failed", "rerun", "running"), 0)
        for trial in self._study().get_trials(deepcopy=False):
            state = trial.state.name
            if state == "FAIL":
                counts["rerun" if trial.user_attrs.get(RETRIED) else "failed"] += 1
            elif state in ("COMPLETE", "PRUNED", "RUNNING"):
                counts[state.lower()] += 1
        return counts

    @property
    def running(self) -> bool:
        """Whether a launcher of the study runs (on this machine), or a trial does."""
        if self.process is not None and self.process.poll() is None:
            return True
        return bool(self._live_launchers()) or self.counts()["running"] > 0

    def wait(self, timeout: float | None = None) -> Sweep:
        """Until the sweep's launchers ended; TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"sweep {self.study_name} still running") from None
        while self._live_launchers():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.study_name} still running")
            time.sleep(POLL_SECONDS)
        return self

    def stop(self) -> None:
        """As Ctrl-C in the launchers' terminals: no new trials; the running jobs stopped
        (their points run again on the next launch) or, with ``sweep.on_interrupt=detach``,
        left to it."""
        for pid in self._live_launchers():
            os.kill(pid, signal.SIGINT)

    @user_errors
    def resume(self, n_trials: int | None = None, *, wait: bool = False) -> Sweep:
        """Launch the sweep again (its study goes on; ``n_trials``: its new total)."""
        if not self.overrides:
            raise UserError(
                "resume: this handle does not know the sweep's overrides; "
                "use paiexp.start_sweep('+sweep=NAME', ...) again"
            )
        extra = (f"sweep.n_trials={n_trials}",) if n_trials is not None else ()
        return launch_sweep(self.overrides + extra, self.base_dir, (), wait=wait)

    def log(self) -> str:
        """What the launcher started here printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    # -- results ---------------------------------------------------------------------------

    def results(self) -> pandas.DataFrame:
        """One row per trial, usable while the sweep runs: number, state, the objective
        value(s), every parameter, each final metric (``metrics.NAME``), duration (s), job
        name, MLflow run id and model URI."""
        import pandas

        study = self._study()
        names = self._objective_names(study)
        runs = self._runs(study)
        rows = []
        for trial in study.get_trials(deepcopy=False):
            run = runs.get(str(trial.number), {})
            values = trial.values or [None] * len(names)
            ended = trial.datetime_complete
            started = trial.datetime_start
            rows.append(
                {
                    "number": trial.number,
                    "state": trial.state.name,
                    **dict(zip(names, values, strict=True)),
                    **trial.params,
                    **{f"metrics.{k}": v for k, v in run.get("metrics", {}).items()},
                    "duration": (ended - started).total_seconds() if ended and started else None,
                    "job_name": trial.user_attrs.get("paiexp:job_name"),
                    "run_id": run.get("run_id"),
                    "model_uri": run.get("paiexp.model_uri"),
                }
            )
        return pandas.DataFrame(rows)

    @property
    def best(self) -> Best:
        """The best complete trial (a tie: the earlier); a study of several objectives has a
        Pareto front instead (:meth:`pareto_front`)."""
        study = self._study()
        if len(study.directions) > 1:
            raise UserError("best: a multi-objective study has a Pareto front: pareto_front()")
        front = self._best_trials(study)
        if not front:
            raise UserError(f"best: no trial of study {self.study_name} has completed yet")
        return front[0]

    def pareto_front(self) -> list[Best]:
        """The best trials: the Pareto front of several objectives, or the best of one."""
        return self._best_trials(self._study())

    def _best_trials(self, study: Study) -> list[Best]:
        from optuna.trial import TrialState

        from paiexp.sweep.progress import best_of
        from paiexp.sweep.study import Objective

        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            return []
        names = self._objective_names(study)
        objectives = [
            Objective(name, d.name.lower()) for name, d in zip(names, study.directions, strict=True)
        ]
        runs = self._runs(study)
        return [
            Best(
                trial.number,
                dict(trial.params),
                dict(zip(names, trial.values, strict=True)),
                runs.get(str(trial.number), {}).get("run_id"),
                runs.get(str(trial.number), {}).get("paiexp.model_uri"),
                self.tracker_uri,
            )
            for trial in best_of(study, objectives, complete)
        ]

    # -- reading -----------------------------------------------------------------------------

    def _study(self) -> Study:
        from paiexp.report import load_study

        _import_optuna()
        return load_study(self.study_name, self.storage)

    def _objective_names(self, study: Study) -> list[str]:
        """The objectives' metric names, as the launcher recorded them."""
        recorded = study.metric_names
        if recorded and len(recorded) == len(study.directions):
            return [str(name) for name in recorded]
        return [f"value_{i}" for i in range(len(study.directions))]

    def _runs(self, study: Study) -> dict[str, dict[str, Any]]:
        """The trials' runs by trial number: run id, tags, final metrics."""
        from paiexp.sweep.opening import PARENT_RUN_ATTR

        parent = study.user_attrs.get(PARENT_RUN_ATTR)
        if not parent:
            return {}
        database = _sqlite_file(self.tracker_uri)
        if database is not None:
            return _sqlite_children(database, parent)
        return _mlflow_children(self.tracker_uri, parent)

    def _live_launchers(self) -> list[int]:
        """The pids of this study's launchers that run on this machine."""
        from paiexp.sweep.ownership import dead_here, heartbeats, parse_owner, this_host

        study = self._study()
        storage = study._storage
        host = this_host()
        owners = heartbeats(storage, study._study_id)
        pids = []
        for owner in owners:
            identity = parse_owner(owner)
            if identity is not None and dead_here(owner, host) is False:
                pids.append(identity.pid)
        return pids


def _import_optuna() -> None:
    """Optuna, without the warning its progress bar's import prints in a notebook that has
    no ipywidgets (paiexp shows no progress bar of Optuna's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import optuna  # noqa: F401
        import tqdm.auto  # noqa: F401


def _sqlite_file(uri: str) -> Path | None:
    from paiexp.download import sqlite_file

    return sqlite_file(uri)


def _sqlite_children(database: Path, parent: str) -> dict[str, dict[str, Any]]:
    """A local store's child runs of ``parent``, read straight from its file (2,000 runs in a
    fraction of a second, where MLflow's client takes seconds)."""
    if not database.is_file():
        return {}
    children = "SELECT run_uuid FROM tags WHERE key = 'mlflow.parentRunId' AND value = ?"
    marks = ", ".join("?" for _ in RESULT_TAGS)
    runs: dict[str, dict[str, Any]] = {}
    with sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True) as connection:
        tags: dict[str, dict[str, Any]] = {}
        query = (
            f"SELECT run_uuid, key, value FROM tags WHERE key IN ({marks}) "
            f"AND run_uuid IN ({children})"
        )
        for run_id, key, value in connection.execute(query, (*RESULT_TAGS, parent)):
            tags.setdefault(run_id, {"run_id": run_id, "metrics": {}})[key] = value
        metrics = f"SELECT run_uuid, key, value FROM latest_metrics WHERE run_uuid IN ({children})"
        for run_id, key, value in connection.execute(metrics, (parent,)):
            if run_id in tags:
                tags[run_id]["metrics"][key] = value
    for run in tags.values():
        number = run.get("paiexp.trial_number")
        if number is not None:
            runs[str(number)] = run
    return runs


def _mlflow_children(uri: str, parent: str) -> dict[str, dict[str, Any]]:
    """Any store's child runs of ``parent``, through MLflow's client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs: dict[str, dict[str, Any]] = {}
    for run in client.search_runs(
        experiments, filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=50000
    ):
        tags = run.data.tags
        number = tags.get("paiexp.trial_number")
        if number is not None:
            runs[number] = {
                "run_id": run.info.run_id,
                "metrics": dict(run.data.metrics),
                **{k: tags[k] for k in RESULT_TAGS if k in tags},
            }
    return runs


@user_errors
def start_sweep(
    *overrides: str,
    project: str | os.PathLike[str] = ".",
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    wait: bool = False,
) -> Sweep:
    """Launch a sweep (``'+sweep=NAME'`` and any overrides) as ``python -m paiexp OVERRIDES``
    in ``project`` launches it, after the same checks (a mistake raises before anything
    starts); the launcher is a detached process that outlives this one, its output in
    ``.paiexp/launchers/``.  ``wait``: return once it ended."""
    base_dir = Path(project).absolute()
    dirs = tuple(str(Path(d).absolute()) for d in config_dirs)
    return launch_sweep(tuple(overrides), base_dir, dirs, wait=wait)


def launch_sweep(
    overrides: tuple[str, ...], base_dir: Path, config_dirs: tuple[str, ...], *, wait: bool
) -> Sweep:
    from paiexp.sweep.prepared import prepare_sweep
    from paiexp.tracking import tracking_uri

    _import_optuna()
    composed = compose_project(overrides, base_dir, config_dirs)
    if composed.kind != "sweep":
        raise UserError(f"sweep: the config is a {composed.kind}; select one with +sweep=NAME")
    prepared = prepare_sweep(composed.cfg, composed.config, composed.base_dir, overrides)
    process, log_path = launch_detached(overrides, base_dir, config_dirs, prepared.study_name)
    handle = Sweep(
        prepared.study_name,
        prepared.storage,
        tracking_uri(prepared.config.tracker.uri, base_dir),
        overrides,
        base_dir,
        process,
        log_path,
    )
    _until_open(handle)
    if wait:
        handle.wait()
    return handle


def _until_open(handle: Sweep) -> None:
    """Wait until the launcher has opened its study (so the handle reads it at once); a
    launcher that ended first is an error naming the last line it printed."""
    assert handle.process is not None and handle.log_path is not None
    deadline = time.monotonic() + OPEN_SECONDS
    while time.monotonic() < deadline:
        try:
            handle._study()
            return
        except UserError:  # not created yet
            if handle.process.poll() is not None:
                said = handle.log().strip().splitlines() or ["(nothing)"]
                raise UserError(
                    f"sweep: the launcher exited {handle.process.returncode}: {said[-1]} "
                    f"(its output: {handle.log_path})"
                ) from None
            time.sleep(0.1)
    raise UserError(f"sweep: no study {handle.study_name} after {OPEN_SECONDS:g} s")


@user_errors
def attach_sweep(
    study_name: str | None = None,
    *,
    run_id: str | None = None,
    storage: str | None = None,
    tracker_uri: str | None = None,
    project: str | os.PathLike[str] = ".",
) -> Sweep:
    """A sweep started anywhere (the command line, another kernel, another machine sharing
    the study), by its study's name (``storage``: its journal or database, default the
    project's ``optuna.journal``) or by its MLflow parent run's id."""
    from paiexp.tracking import STUDY_NAME_TAG, tracking_uri

    base_dir = Path(project).absolute()
    uri = tracking_uri(tracker_uri, base_dir)
    if run_id is not None:
        parent = reader(uri).get_run(run_id)
        if parent is None or parent.tags.get("paiexp.kind") != "sweep":
            raise UserError(f"run_id: {run_id} is no sweep's parent run in {uri}")
        study_name = parent.tags[STUDY_NAME_TAG]
        storage = storage or parent.tags.get("paiexp.storage")
    if study_name is None:
        raise UserError("attach_sweep: give a study name or a parent run id")
    location = storage or str(base_dir / "optuna.journal")
    handle = Sweep(study_name, location, uri, base_dir=base_dir)
    handle._study()  # a study that does not exist is a ConfigError now, not later
    return handle
