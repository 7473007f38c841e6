"""A job's own MLflow store merged into its run: what its script logged with MLflow itself.

The store is MLflow's file store, which the script's ``start_run``, ``log_*`` and
``autolog`` wrote in the job's outputs (:mod:`paiexp.contract.job_mlflow`); it is read with MLflow's
own reader.  Every run in it (a script may make several; the oldest first) is merged into
the job's run:

- params, except a name the run holds: the same value is nothing to do, another value one
  warning line naming it (MLflow params are immutable: paiexp's own are never replaced);
- tags, except paiexp's (``paiexp.*``) and MLflow's tags of the job's own run
  (``mlflow.runName``, ``mlflow.user``, ``mlflow.parentRunId``, ``mlflow.source.*``); a tag
  the run held before with another value is kept, one warning line naming it;
- metric points, each with its own step and time, once;
- dataset inputs, and artifacts at their paths (never over paiexp's own files, and no
  symbolic link: what the job names out of its store stays where it is);
- logged models (MLflow 3), once finished: each made again in the run's experiment from its
  files, params, tags and final metrics, the run's output, tagged with its id in the job's
  store (:data:`JOB_MODEL_TAG`) so that it is made once.

Merging again adds nothing twice: a :class:`StoreMerge` remembers what it wrote (a later pass
while the job runs); one made for a run merged into before (``resumed``: a relaunched
launcher's) reads what the run holds first.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOB_MODEL_TAG = "paiexp.job_model_id"  # a merged model: its id in the job's own store
IDENTITY_TAGS = frozenset({"mlflow.runName", "mlflow.user", "mlflow.parentRunId"})
IDENTITY_PREFIXES = ("mlflow.source.", "paiexp.")
Point = tuple[int, int, float | str]  # step, timestamp, value (NaN as a string: comparable)
MANY = 50000  # runs or models a job's store may hold: all of them


class StoreMerge:
    """Merges of a job's store into its run ``run_id`` through ``client`` (an
    ``MlflowClient``).  ``protected``: the run's artifact paths that are paiexp's (one
    ending in ``/``: everything under it)."""

    def __init__(
        self,
        client: Any,
        run_id: str,
        job_name: str,
        *,
        resumed: bool,
        protected: tuple[str, ...] = (),
    ) -> None:
        self.client = client
        self.experiment_id = ""  # the run's, read at the first merge
        self.run_id = run_id
        self.job_name = job_name
        self.resumed = resumed
        self.protected = protected
        self._held: dict[str, dict[str, str]] | None = None  # the run's params and tags
        self._points: dict[str, set[Point]] = {}  # metric -> the points the run holds
        self._files: dict[str, tuple[int, int]] = {}  # artifact -> (size, mtime) merged
        self._models: set[str] = set()  # the job's model ids merged
        self._said: set[str] = set()  # the warnings given

    def merge(self, store: Path) -> list[str]:
        """Merge what ``store`` holds that the run does not yet; the new warnings.  A store
        MLflow cannot read raises :class:`Unreadable` before anything is merged."""
        runs, models = read_store(store)
        warnings: list[str] = []
        for run in runs:
            warnings += self._run(store, run)
        for model in models:
            self._model(store, model)
        return warnings

    # -- one run of the job's store -----------------------------------------------------------

    def _run(self, store: Path, run: StoredRun) -> list[str]:
        from mlflow.entities import Param, RunTag

        held = self._look()
        warnings: list[str] = []
        params, tags = [], []
        for key, value in run.params.items():
            known = held["params"].get(key)
            if known is None:
                params.append(Param(key, value))
                held["params"][key] = value
            elif known != value:
                warnings += self._warn(
                    f"param {key!r}", f"logged as {value!r}, the run keeps {known!r}"
                )
        for key, value in run.tags.items():
            if key in IDENTITY_TAGS or key.startswith(IDENTITY_PREFIXES):
                continue
            known = held["tags"].get(key)
            if known is None or key in held["merged"]:
                if known != value:
                    tags.append(RunTag(key, value))
                    held["tags"][key] = held["merged"][key] = value
            elif known != value:
                warnings += self._warn(f"tag {key!r}", f"set to {value!r}, the run keeps {known!r}")
        metrics = self._new_points(run)
        if params or tags or metrics:
            self.client.log_batch(self.run_id, metrics=metrics, params=params, tags=tags)
        if run.datasets:
            self.client.log_inputs(self.run_id, datasets=run.datasets)
        warnings += self._artifacts(store / run.experiment_id / run.run_id / "artifacts")
        return warnings

    def _look(self) -> dict[str, dict[str, str]]:
        """The run's params and tags as it held them at the first merge, and the tags merged
        since (which the job may set again)."""
        if self._held is None:
            run = self.client.get_run(self.run_id)
            self.experiment_id = str(run.info.experiment_id)
            data = run.data
            self._held = {"params": dict(data.params), "tags": dict(data.tags), "merged": {}}
        return self._held

    def _new_points(self, run: StoredRun) -> list[Any]:
        """The store run's metric points the job's run does not hold yet."""
        from mlflow.entities import Metric

        new = []
        for metric in run.metrics:
            held = self._held_points(metric.key)
            point = _point(metric)
            if point not in held:
                held.add(point)
                new.append(Metric(metric.key, metric.value, metric.timestamp, metric.step))
        return new

    def _held_points(self, key: str) -> set[Point]:
        if key not in self._points:
            history = self.client.get_metric_history(self.run_id, key) if self.resumed else []
            self._points[key] = {_point(metric) for metric in history}
        return self._points[key]

    def _artifacts(self, directory: Path) -> list[str]:
        """Upload the files of a run's artifact directory that are new or changed since the
        last merge, in one go; paiexp's own paths and symbolic links are left out."""
        warnings: list[str] = []
        changed: dict[str, Path] = {}
        for relative, path in _files(directory):
            if self._is_protected(relative):
                warnings += self._warn(f"artifact {relative!r}", "is paiexp's own: not merged")
                continue
            info = path.stat()
            seen = (info.st_size, info.st_mtime_ns)
            if self._files.get(relative) != seen:
                changed[relative] = path
                self._files[relative] = seen
        if changed:
            with _staged(changed) as staging:
                self.client.log_artifacts(self.run_id, staging)
        return warnings

    def _is_protected(self, relative: str) -> bool:
        return any(
            relative.startswith(entry) if entry.endswith("/") else relative == entry
            for entry in self.protected
        )

    # -- logged models ------------------------------------------------------------------------

    def _model(self, store: Path, model: Any) -> None:
        """The job's finished logged ``model`` as a logged model of the run (once)."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric

        if model.model_id in self._models or model.status != LoggedModelStatus.READY:
            return
        self._look()  # the run's experiment
        merged = self._merged_model(model)
        if merged.status != LoggedModelStatus.READY:
            directory = store / model.experiment_id / "models" / model.model_id / "artifacts"
            files = dict(_files(directory))
            if files:
                with _staged(files) as staging:
                    self.client.log_model_artifacts(merged.model_id, staging)
            self.client.finalize_logged_model(merged.model_id, LoggedModelStatus.READY)
        link = {"model_id": merged.model_id, "run_id": self.run_id}
        final = [Metric(m.key, m.value, m.timestamp, m.step, **link) for m in model.metrics or []]
        if final:  # the same points again after a relaunch: MLflow keeps them once
            self.client.log_batch(self.run_id, metrics=final)
        outputs = self.client.get_run(self.run_id).outputs
        linked = {output.model_id for output in outputs.model_outputs} if outputs else set()
        if merged.model_id not in linked:
            self.client.log_outputs(self.run_id, [LoggedModelOutput(merged.model_id, step=0)])
        self._models.add(model.model_id)

    def _merged_model(self, model: Any) -> Any:
        """The run's logged model made from the job's ``model``: found again, else made."""
        found = self.client.search_logged_models(
            [self.experiment_id],
            filter_string=f"tags.`{JOB_MODEL_TAG}` = '{model.model_id}'",
            max_results=10,
        )
        mine = [m for m in found if m.source_run_id == self.run_id]
        if mine:
            return min(mine, key=lambda m: (m.creation_timestamp, m.model_id))
        tags = {
            key: value
            for key, value in (model.tags or {}).items()
            if key not in IDENTITY_TAGS and not key.startswith(IDENTITY_PREFIXES)
        }
        return self.client.create_logged_model(
            self.experiment_id,
            name=model.name,
            source_run_id=self.run_id,
            tags={**tags, JOB_MODEL_TAG: model.model_id},
            params=dict(model.params or {}),
            model_type=model.model_type,
        )

    def _warn(self, what: str, why: str) -> list[str]:
        """One warning line per thing, however often it is merged."""
        if what in self._said:
            return []
        self._said.add(what)
        return [f"job {self.job_name}: its own MLflow {what} {why}"]


@contextlib.contextmanager
def _file_store_allowed() -> Iterator[None]:
    """MLflow 3.17 opens its file store only with ``MLFLOW_ALLOW_FILE_STORE=true``: so here,
    for this reader only."""
    name = "MLFLOW_ALLOW_FILE_STORE"
    before = os.environ.get(name)
    os.environ[name] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


class Unreadable(Exception):
    """A job's store that MLflow's reader cannot read (what the job left is broken)."""


@dataclass(frozen=True)
class StoredRun:
    """A run of a job's store, as read: its metrics are every point of each."""

    experiment_id: str
    run_id: str
    params: dict[str, str]
    tags: dict[str, str]
    metrics: list[Any]
    datasets: list[Any]


def read_store(store: Path) -> tuple[list[StoredRun], list[Any]]:
    """The runs in a job's file store (the oldest first) and its logged models, read whole
    before anything is merged; :class:`Unreadable` when MLflow cannot read it."""
    from mlflow.entities import ViewType
    from mlflow.store.tracking.file_store import FileStore

    try:
        with _file_store_allowed():
            reader = FileStore(str(store))
        experiments = [e.experiment_id for e in reader.search_experiments(view_type=ViewType.ALL)]
        found = reader.search_runs(experiments, "", ViewType.ACTIVE_ONLY, max_results=MANY)
        runs = [
            StoredRun(
                str(run.info.experiment_id),
                run.info.run_id,
                dict(run.data.params),
                dict(run.data.tags),
                _history(reader, run),
                list(run.inputs.dataset_inputs) if run.inputs else [],
            )
            for run in sorted(found, key=lambda r: (r.info.start_time or 0, r.info.run_id))
        ]
        models = list(reader.search_logged_models(experiments, max_results=MANY))
    except Exception as exc:  # MLflow's reader raises what its parsers raise
        raise Unreadable(f"{type(exc).__name__}: {exc}") from exc
    return runs, models


def _history(reader: Any, run: Any) -> list[Any]:
    """Every point of every metric of a store's run."""
    run_id = run.info.run_id
    return [m for key in run.data.metrics for m in reader.get_metric_history(run_id, key)]


@contextlib.contextmanager
def _staged(files: dict[str, Path]) -> Iterator[str]:
    """A temporary directory holding a copy of each file at its relative path."""
    with tempfile.TemporaryDirectory(prefix="paiexp-merge-") as staging:
        for relative, path in files.items():
            target = Path(staging, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        yield staging


def _files(directory: Path) -> Iterator[tuple[str, Path]]:
    """The regular files under ``directory`` (no symbolic link followed or taken), each by
    its path relative to it."""
    if not directory.is_dir() or directory.is_symlink():
        return
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for name in files:
            path = Path(root, name)
            if path.is_file() and not path.is_symlink():
                yield path.relative_to(directory).as_posix(), path


def _point(metric: Any) -> Point:
    value = metric.value
    return metric.step, metric.timestamp, "nan" if math.isnan(value) else value
