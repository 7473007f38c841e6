"""The Python API's sweeps: launched as the command line launches them (the same crash-safe
launcher, a detached process of its own, so a notebook kernel's restart does not end the
sweep), or attached to wherever they were started; progress, stop, resume, results as a
DataFrame while the sweep runs, and the best trial with its model.

Cheap to import: Optuna, MLflow and pandas load when a sweep is launched or read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import signal
import sqlite3
import subprocess
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paiexp.api.display import StatusLine
from paiexp.api.jobs import Job, attach_job, compose_project, reader, user_errors, working_in
from paiexp.api.launch import launch_detached
from paiexp.errors import UserError

if TYPE_CHECKING:
    import pandas
    from omegaconf import DictConfig
    from optuna import Study
    from optuna.trial import FrozenTrial

    from paiexp.api.jobs import Composed
    from paiexp.sweep.prepared import PreparedSweep, SweepOutcome
    from paiexp.sweep.progress import Progress
    from paiexp.sweep.study import Objective

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
    n_trials: int | None = None  # the study's total, when known (else read from its parent run)
    config_file: Path | None = None  # a sweep defined in Python: its whole config, saved

    # -- progress --------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Trials by state, as the command line's status line counts them: ``complete``,
        ``pruned``, ``failed`` (counted toward n_trials), ``rerun`` (failed, run again),
        ``preempted`` (of those re-run: the platform took their jobs away), ``running``."""
        from paiexp.sweep.progress import TrialCounts

        return dataclasses.asdict(TrialCounts.of(self._study().get_trials(deepcopy=False)))

    @property
    def running(self) -> bool:
        """Whether a launcher of the study runs (on this machine), or a trial does."""
        if self.process is not None and self.process.poll() is None:
            return True
        return bool(self._live_launchers()) or self.counts()["running"] > 0

    def status(self) -> str:
        """The command line's status line, read from the study: ``sweep 12/30 done (10
        complete, 2 pruned) · 2 running · best test-auc=0.98 (trial 7) · 01:05.2`` (from its
        first trial's start to its last one's end, or to now while one runs)."""
        from optuna.trial import TrialState

        from paiexp.sweep.progress import TrialCounts, best_of, best_text, status_line
        from paiexp.sweep.spending import spent

        study = self._study()
        trials = study.get_trials(deepcopy=False)
        objectives = self._objectives(study)
        complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
        best = best_text(objectives, best_of(study, objectives, complete) if complete else [])
        total = spent(trials)
        cost = total.text() if total else None
        line = status_line(TrialCounts.of(trials), self._total(study), best, _elapsed(trials), cost)
        return line.plain

    def wait(self, timeout: float | None = None, *, progress: bool = False) -> Sweep:
        """Until the sweep's launchers ended; TimeoutError after ``timeout`` seconds.
        ``progress``: meanwhile show :meth:`status`, kept current (in a notebook, one output
        replaced in place)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = StatusLine() if progress else None
        try:
            while self._launched_here_runs() or self._live_launchers():
                if shown is not None:
                    shown.show(self.status())
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"sweep {self.study_name} still running")
                self._pause()
            if shown is not None:
                shown.show(self.status())
        finally:
            if shown is not None:
                shown.close()
        return self

    def _launched_here_runs(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _pause(self) -> None:
        """A poll's interval, cut short when the launcher started here ends."""
        if self.process is None:
            time.sleep(POLL_SECONDS)
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(POLL_SECONDS)

    def stop(self, *, detach: bool = False) -> None:
        """As Ctrl-C in the launchers' terminals: no new trials; the running jobs stopped
        (their points run again on the next launch) or, with ``detach`` (a SIGTERM) or
        ``sweep.on_interrupt=detach``, left running for the next launch to re-attach."""
        for pid in self._live_launchers():
            os.kill(pid, signal.SIGTERM if detach else signal.SIGINT)

    @user_errors
    def resume(self, n_trials: int | None = None, *, wait: bool = False) -> Sweep:
        """Launch the sweep again (its study goes on; ``n_trials``: its new total)."""
        extra = (f"sweep.n_trials={n_trials}",) if n_trials is not None else ()
        if self.config_file is not None:
            return launch_saved_sweep(self.config_file, extra, self.base_dir, wait=wait)
        if not self.overrides:
            raise UserError(
                "resume: this handle does not know the sweep's overrides; "
                "use paiexp.start_sweep('+sweep=NAME', ...) again"
            )
        return launch_sweep(self.overrides + extra, self.base_dir, (), wait=wait)

    def log(self) -> str:
        """What the launcher started here printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    # -- results ---------------------------------------------------------------------------

    def results(self) -> pandas.DataFrame:
        """One row per trial, usable while the sweep runs: number, state, the objective
        value(s), every parameter, each final metric (``metrics.NAME``), duration (s), what
        its job cost (``instance_hours``, ``cost``, ``currency``: None until it ended or
        unpriced), job name, MLflow run id and model URI."""
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
                    **_cost_columns(trial),
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

        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            return []
        names = self._objective_names(study)
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
            for trial in best_of(study, self._objectives(study), complete)
        ]

    # -- reading -----------------------------------------------------------------------------

    def _study(self) -> Study:
        from paiexp.commands.report import load_study

        _import_optuna()
        return load_study(self.study_name, self.storage)

    def _objective_names(self, study: Study) -> list[str]:
        """The objectives' metric names, as the launcher recorded them."""
        recorded = study.metric_names
        if recorded and len(recorded) == len(study.directions):
            return [str(name) for name in recorded]
        return [f"value_{i}" for i in range(len(study.directions))]

    def _objectives(self, study: Study) -> list[Objective]:
        from paiexp.sweep.study import Objective

        names = self._objective_names(study)
        return [
            Objective(name, d.name.lower()) for name, d in zip(names, study.directions, strict=True)
        ]

    def _total(self, study: Study) -> int | None:
        """``sweep.n_trials``: as launched here, else as its parent run records it."""
        from paiexp.sweep.opening import PARENT_RUN_ATTR

        parent = study.user_attrs.get(PARENT_RUN_ATTR)
        if self.n_trials is None and parent:
            tracked = reader(self.tracker_uri).get_run(parent)
            recorded = tracked.tags.get("paiexp.n_trials") if tracked else None
            self.n_trials = int(recorded) if recorded else None
        return self.n_trials

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


def _cost_columns(trial: FrozenTrial) -> dict[str, Any]:
    """What a trial's job cost, as the study recorded it (see paiexp.sweep.spending)."""
    from paiexp.sweep.spending import trial_cost

    cost = trial_cost(trial)
    return {
        "instance_hours": cost.instance_hours if cost else None,
        "cost": cost.cost if cost else None,
        "currency": cost.currency if cost else None,
    }


def _import_optuna() -> None:
    """Optuna, without the warning its progress bar's import prints in a notebook that has
    no ipywidgets (paiexp shows no progress bar of Optuna's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import optuna  # noqa: F401
        import tqdm.auto  # noqa: F401


def _sqlite_file(uri: str) -> Path | None:
    from paiexp.commands.download import sqlite_file

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
    *overrides: str | Composed,
    project: str | os.PathLike[str] = ".",
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    wait: bool = False,
    space: Mapping[str, Any] | None = None,
    objective: str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    direction: str = "minimize",
    **settings: Any,
) -> Sweep:
    """Launch a sweep (``'+sweep=NAME'`` and any overrides) as ``python -m paiexp OVERRIDES``
    in ``project`` launches it, after the same checks (a mistake raises before anything
    starts); the launcher is a detached process that outlives this one, its output in
    ``.paiexp/launchers/``.  ``wait``: return once it ended.

    Or a sweep defined here, no ``sweeps/`` file needed: ``start_sweep(job, space={...},
    objective="test-auc", direction="maximize", n_trials=40, parallelism=4)`` sweeps a composed
    job (:func:`paiexp.job`, :func:`paiexp.from_project`) over ``space`` (each parameter in the
    ``sweeps/`` grammar, ``"interval(0.01, 0.3)"``, or an Optuna distribution);
    ``objective``: a metric the job reports (with ``direction``) or ``{metric, direction}``
    items; ``settings``: any other ``sweep.*`` key (``name``, ``sampler``, ``pruner``,
    ``storage``, ``study_name``, ...), every one checked as a ``sweeps/`` file's are."""
    if overrides and not isinstance(overrides[0], str):
        if len(overrides) > 1:
            raise UserError(
                "start_sweep: a composed job is swept alone (compose it with its overrides)"
            )
        return launch_defined_sweep(overrides[0], space, objective, direction, settings, wait=wait)
    if space is not None or objective is not None or settings:
        given = "space" if space is not None else "objective" if objective else next(iter(settings))
        raise UserError(
            f"start_sweep: {given}= defines a sweep of a composed job: "
            "start_sweep(paiexp.job(...), space={...}, objective=...); a sweeps/ file's "
            "settings are overrides: start_sweep('+sweep=NAME', 'sweep.n_trials=40')"
        )
    base_dir = Path(project).absolute()
    dirs = tuple(str(Path(d).absolute()) for d in config_dirs)
    return launch_sweep(tuple(str(o) for o in overrides), base_dir, dirs, wait=wait)


def launch_sweep(
    overrides: tuple[str, ...], base_dir: Path, config_dirs: tuple[str, ...], *, wait: bool
) -> Sweep:
    _import_optuna()
    composed = compose_project(overrides, base_dir, config_dirs)
    if composed.kind != "sweep":
        raise UserError(f"sweep: the config is a {composed.kind}; select one with +sweep=NAME")
    prepared = composed.prepared_sweep()
    process, log_path = launch_detached(overrides, base_dir, config_dirs, prepared.study_name)
    return _launched(prepared, process, log_path, overrides=overrides, wait=wait)


def launch_saved_sweep(
    config_file: Path, edits: tuple[str, ...], base_dir: Path, *, wait: bool
) -> Sweep:
    """A sweep defined in Python launched again from its saved config, ``KEY=VALUE`` edits
    applied."""
    from paiexp.api.jobs import Composed
    from paiexp.config.compose import from_yaml

    _import_optuna()
    cfg = from_yaml(config_file.read_text(encoding="utf-8"), edits)
    with working_in(base_dir):
        prepared = Composed(cfg, base_dir, edits).prepared_sweep()
    argv = ("--config-file", str(config_file), *edits)
    process, log_path = launch_detached(argv, base_dir, (), prepared.study_name)
    return _launched(prepared, process, log_path, config_file=config_file, wait=wait)


def launch_defined_sweep(
    job: object,
    space: Mapping[str, Any] | None,
    objective: Any,
    direction: str,
    settings: Mapping[str, Any],
    *,
    wait: bool,
) -> Sweep:
    """A sweep of a composed job defined by keyword arguments: checked, its whole config saved
    in ``.paiexp/sweeps/STUDY.yaml``, launched from it (``python -m paiexp --config-file``)."""
    from paiexp.api.jobs import Composed

    if not isinstance(job, Composed):
        raise UserError(
            f"start_sweep: expected overrides (strings) or a composed job, got {type(job).__name__}"
        )
    if job.kind != "job":
        raise UserError(f"start_sweep: space= sweeps one job; this config is a {job.kind}")
    if not isinstance(space, Mapping) or not space:
        raise UserError(
            "start_sweep: space= is required: {name: 'interval(0.01, 0.3)', "
            "name: an Optuna distribution, name: a fixed value}"
        )
    if objective is None:
        raise UserError(
            "start_sweep: objective= is required: a metric the job reports "
            "(objective='test-auc', direction='maximize'), or {metric, direction} items"
        )
    _import_optuna()
    composed = Composed(
        _with_sweep(job, space, objective, direction, settings),
        job.base_dir,
        job.overrides,
        job.project,
    )
    with working_in(job.base_dir):
        prepared = composed.prepared_sweep()
    saved = _save_config(composed, prepared.study_name)
    process, log_path = launch_detached(
        ("--config-file", str(saved)), job.base_dir, (), prepared.study_name
    )
    return _launched(prepared, process, log_path, config_file=saved, wait=wait)


def _with_sweep(
    job: Composed,
    space: Mapping[str, Any],
    objective: Any,
    direction: str,
    settings: Mapping[str, Any],
) -> DictConfig:
    """The job's config with a ``sweep:`` node of the keyword arguments, checked against the
    schema (an unknown key or a wrong type named as ``sweep.KEY``)."""
    from omegaconf import DictConfig, OmegaConf

    from paiexp.config.compose import describe_error
    from paiexp.sweep.space import written

    if isinstance(objective, str):
        objective = {"metric": objective, "direction": direction}
    node = {
        "name": job.cfg.job.name,
        **settings,
        "objective": objective,
        "params": {str(name): written(value) for name, value in space.items()},
    }
    try:
        cfg = OmegaConf.merge(job.cfg, {"sweep": node})
    except Exception as exc:  # OmegaConf's validation errors: one line naming the key
        raise UserError(describe_error(exc)) from None
    assert isinstance(cfg, DictConfig)
    return cfg


def _save_config(composed: Composed, study_name: str) -> Path:
    """The sweep's whole config in its project's ``.paiexp/sweeps/``, for its launcher and
    its next launch (:meth:`Sweep.resume`)."""
    from omegaconf import OmegaConf

    saved = composed.base_dir / ".paiexp" / "sweeps" / f"{study_name}.yaml"
    saved.parent.mkdir(parents=True, exist_ok=True)
    partial = saved.with_name(saved.name + ".partial")
    partial.write_text(OmegaConf.to_yaml(composed.cfg), encoding="utf-8")
    partial.replace(saved)
    return saved


def _launched(
    prepared: PreparedSweep,
    process: subprocess.Popen[bytes],
    log_path: Path,
    *,
    overrides: tuple[str, ...] = (),
    config_file: Path | None = None,
    wait: bool,
) -> Sweep:
    """The handle of a launcher just started, once it has opened its study."""
    from paiexp.tracking.mlflow_tracker import tracking_uri

    handle = Sweep(
        prepared.study_name,
        prepared.storage,
        tracking_uri(prepared.config.tracker.uri, prepared.base_dir),
        overrides,
        prepared.base_dir,
        process,
        log_path,
        prepared.sweep.n_trials,
        config_file,
    )
    _until_open(handle)
    if wait:
        handle.wait()
    return handle


def run_prepared_sweep(prepared: PreparedSweep, progress: Progress | None = None) -> SweepOutcome:
    """Run a checked sweep in this process to its end (or Ctrl-C): the crash-safe launcher
    every sweep runs, the command line's and each one :func:`start_sweep` detaches alike.
    ``progress``: what a person is shown meanwhile (default: nothing)."""
    from rich.console import Console

    from paiexp.sweep.launcher import Launcher
    from paiexp.sweep.progress import Progress

    shown = progress or Progress(
        prepared.sweep.n_trials, prepared.objectives, console=Console(quiet=True)
    )
    return Launcher(prepared, shown).run()


def run_shown_sweep(prepared: PreparedSweep) -> SweepOutcome:
    """Run a checked sweep here to its end, its progress and its summary shown (the command
    line's way)."""
    from paiexp.sweep.progress import Progress, print_summary

    progress = Progress(prepared.sweep.n_trials, prepared.objectives)
    outcome = run_prepared_sweep(prepared, progress)
    print_summary(
        progress.console,
        outcome,
        prepared.objectives,
        prepared.storage,
        prepared.study_name,
        prepared.base_dir,
    )
    return outcome


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
    from paiexp.tracking.mlflow_tracker import STUDY_NAME_TAG, tracking_uri

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


def _elapsed(trials: Sequence[FrozenTrial]) -> float:
    """Seconds from the first trial's start to the last one's end (now, while one runs)."""
    now = datetime.datetime.now()  # Optuna keeps trial times naive, in local time
    spans = [(t.datetime_start, t.datetime_complete or now) for t in trials if t.datetime_start]
    if not spans:
        return 0.0
    return (max(end for _, end in spans) - min(start for start, _ in spans)).total_seconds()
