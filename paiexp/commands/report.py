"""``paiexp report [SWEEP | RUN_ID]``: a sweep's top trials in the terminal, and one
self-contained HTML file of its plots, written locally and logged to the sweep's parent run.

The sweep is found by its name (``sweeps/NAME.yaml``: its study's storage and name, as a
launch would compose them, overrides included) or by the MLflow run id of its parent run or
of one of its trials (the parent run records the study's storage and name).  The report's
artifact always has the same path, so a second report replaces the first.
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paiexp.config.compose import Project, compose, to_object
from paiexp.config.files import SWEEPS
from paiexp.errors import UserError
from paiexp.sweep.study import Objective, storage_location
from paiexp.util.confine import inside
from paiexp.util.redact import redact_url

if TYPE_CHECKING:
    from optuna import Study

    from paiexp.config.schema import Config
    from paiexp.tracking.mlflow_tracker import MlflowTracker, TrackedRun

ARTIFACT_DIR = "report"
ARTIFACT_NAME = "sweep_report.html"
REPORTS_DIR = "reports"  # in the project: reports/<study>.html unless --output says otherwise
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
OBJECTIVE = re.compile(r"(.+?) \((minimize|maximize)\)(?:, |$)")


@dataclass(frozen=True)
class SweepTarget:
    """Where a sweep's study is, what it optimizes, and its parent run (if tracked)."""

    study_name: str
    storage: str
    metrics: list[str]  # objective metric names, in the study's order
    config: Config
    tracker: MlflowTracker | None = None  # opened once the study is found, if not already
    parent_run_id: str | None = None


def report(
    project: Project, target: str, overrides: Sequence[str], output: str | None, top: int
) -> int:
    """Print the top trials, write the HTML report and log it to the parent run."""
    from rich.console import Console

    from paiexp.commands.report_html import render_report
    from paiexp.runs import open_tracker
    from paiexp.sweep.progress import top_trials, trials_table

    if importlib.util.find_spec("plotly") is None:
        raise UserError("paiexp report draws its plots with plotly: pip install 'paiexp[report]'")
    located = locate(project, target, overrides)
    study = load_study(located.study_name, located.storage)
    reports = project.base_dir / REPORTS_DIR
    name = f"study {study.study_name!r}'s report"  # a shared study's name is outside data
    path = Path(output) if output else inside(reports, f"{study.study_name}.html", name=name)
    tracker = located.tracker or open_tracker(located.config)
    parent_run_id = located.parent_run_id or _parent_of(tracker, study)
    objectives = _objectives(study, located.metrics)
    console = Console(width=None if Console().is_terminal else 160)
    best = top_trials(study, objectives, top)
    if best:
        console.print(trials_table(best, objectives, f"top trials of study {study.study_name}"))
    else:
        console.print(f"study {study.study_name}: no trial completed yet")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(
        study,
        objectives,
        best,
        storage=redact_url(located.storage),
        parent_run_id=parent_run_id,
    )
    path.write_text(text, encoding="utf-8")
    print(f"report: {path}")
    if parent_run_id is None:
        print(f"no MLflow parent run of study {study.study_name} in {redact_url(tracker.uri)}")
        return 0
    with tempfile.TemporaryDirectory() as directory:  # the same artifact name every time
        fixed = Path(directory, ARTIFACT_NAME)
        fixed.write_text(text, encoding="utf-8")
        tracker.log_artifact(parent_run_id, fixed, ARTIFACT_DIR)
    print(f"logged to MLflow run {parent_run_id} as {ARTIFACT_DIR}/{ARTIFACT_NAME}")
    return 0


def locate(project: Project, target: str, overrides: Sequence[str]) -> SweepTarget:
    """The sweep ``target`` names: a sweep of ``sweeps/`` first, else an MLflow run id."""
    from paiexp.runs import open_tracker

    if target in SWEEPS.available(project.sweeps_dir):
        config = to_object(compose(project, [f"+sweep={target}", *overrides]))
        sweep = config.sweep
        assert sweep is not None
        items = sweep.objective if isinstance(sweep.objective, list) else [sweep.objective]
        return SweepTarget(
            study_name=sweep.study_name or sweep.name,
            storage=storage_location(sweep.storage, project.base_dir),
            metrics=[str(item["metric"]) for item in items],
            config=config,
        )
    if not RUN_ID.match(target):
        names = ", ".join(SWEEPS.available(project.sweeps_dir)) or "none"
        raise UserError(
            f"report: {target!r} is neither a sweep (available: {names}) nor an MLflow run id"
        )
    config = to_object(compose(project, list(overrides)))
    tracker = open_tracker(config)
    parent = _sweep_run(tracker, target)
    params = tracker.run_params(parent.run_id)
    return SweepTarget(
        study_name=parent.tags["paiexp.study_name"],
        storage=_storage(project, parent),
        metrics=[m.group(1) for m in OBJECTIVE.finditer(params.get("sweep.objective", ""))],
        config=config,
        tracker=tracker,
        parent_run_id=parent.run_id,
    )


def _sweep_run(tracker: MlflowTracker, run_id: str) -> TrackedRun:
    """The parent run of the sweep that ``run_id`` is (or is a trial of)."""
    from paiexp.tracking.mlflow_tracker import KIND_TAG, PARENT_RUN_TAG

    run = tracker.get_run(run_id)
    if run is None:
        raise UserError(f"run_id: no MLflow run {run_id!r} in {redact_url(tracker.uri)}")
    if run.tags.get(KIND_TAG) != "sweep":
        parent_id = run.tags.get(PARENT_RUN_TAG)
        parent = tracker.get_run(parent_id) if parent_id else None
        if parent is None or parent.tags.get(KIND_TAG) != "sweep":
            raise UserError(f"run_id: run {run_id} is neither a sweep's run nor a trial's")
        run = parent
    return run


def _storage(project: Project, parent: TrackedRun) -> str:
    """The study's storage as the parent run records it; a URL whose password MLflow does
    not keep is taken from the sweep of the same name in ``sweeps/``, when it is that one."""
    recorded = parent.tags["paiexp.storage"]
    if "<redacted>" not in recorded:
        return recorded
    name = parent.tags["paiexp.study_name"]
    if name in SWEEPS.available(project.sweeps_dir):
        sweep = to_object(compose(project, [f"+sweep={name}"])).sweep
        assert sweep is not None
        storage = storage_location(sweep.storage, project.base_dir)
        if redact_url(storage) == recorded:
            return storage
    raise UserError(
        f"run_id: the study's storage {recorded} needs its password, which MLflow does not "
        "keep; report it by its sweep's name instead: paiexp report SWEEP [sweep.storage=URL]"
    )


def load_study(study_name: str, storage: str) -> Study:
    """The study, read only; a missing one is a UserError (nothing is created)."""
    import optuna

    from paiexp.sweep.study import create_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if "://" not in storage and not Path(storage).is_file():
        raise UserError(f"sweep.storage: no study journal at {storage}; run the sweep first")
    try:
        return optuna.load_study(study_name=study_name, storage=create_storage(storage))
    except KeyError:
        raise UserError(
            f"sweep.study_name: no study {study_name!r} in {redact_url(storage)}; "
            "run the sweep first"
        ) from None


def _parent_of(tracker: MlflowTracker, study: Study) -> str | None:
    """The sweep's parent run in the tracker's experiment: the one the study records, else
    the one tagged with the study's sweep id."""
    from paiexp.sweep.opening import PARENT_RUN_ATTR
    from paiexp.sweep.records import SWEEP_ID

    sweep_id = study.user_attrs.get(SWEEP_ID)
    if sweep_id is None:
        return None
    recorded = tracker.sweep_run(study.user_attrs.get(PARENT_RUN_ATTR), sweep_id)
    return recorded or tracker.find_sweep_run(sweep_id)


def _objectives(study: Study, metrics: list[str]) -> list[Objective]:
    directions = [d.name.lower() for d in study.directions]
    if len(metrics) != len(directions):  # not recorded: name them by position
        metrics = [f"objective {i}" for i in range(len(directions))]
    return [Objective(m, d) for m, d in zip(metrics, directions, strict=True)]
