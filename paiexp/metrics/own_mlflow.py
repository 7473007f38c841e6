"""A job's own MLflow metrics as metrics while it runs: the metric files of the MLflow store its
``mlflow.log_metric`` and ``autolog`` calls write in its outputs
(:mod:`paiexp.contract.job_mlflow`),
read as they grow, each line a point of a metric series.

A job declares the metrics it is judged by (``job.mlflow_metrics``: a sweep's objective, its
pruner and a pipeline's conditions may name them); every other metric in its store is read too,
unless a log definition or a TensorBoard scalar has its name (that one is the metric's source).
All of them are merged into the job's run when it ends (:mod:`paiexp.tracking.store_merge`); a point
read here carries the store's own step and time, so a sweep's trial that logged it as it ran
holds it once after the merge (MLflow's SQL store keeps an equal row once).

MLflow's file store keeps a run's metric ``KEY`` in ``EXPERIMENT/RUN/metrics/KEY`` (a key
with ``/`` in nested directories), one line a point: ``TIMESTAMP_MS VALUE STEP`` (two more
fields name a dataset).  Only whole lines are read; a line being written is read once its
end is there.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from paiexp.contract.job_mlflow import METRICS_DIR
from paiexp.errors import UserError
from paiexp.metrics.extraction import METRIC_NAME, MetricPoint


def parse_mlflow_metrics(declared: Iterable[object], taken: Collection[str]) -> tuple[str, ...]:
    """``job.mlflow_metrics`` checked: metric keys, each once, none a name ``taken`` by a log
    definition or a TensorBoard metric."""
    names: list[str] = []
    for index, name in enumerate(declared):
        key = f"job.mlflow_metrics[{index}]"
        if not isinstance(name, str) or not METRIC_NAME.match(name):
            raise UserError(
                f"{key}: invalid value {name!r}; expected an MLflow metric key of letters, "
                "digits, '_', '-', '.', '/' and spaces (e.g. val_loss)"
            )
        if name in taken:
            raise UserError(
                f"{key}: metric name {name!r} is a job.metric_definitions or "
                "job.tensorboard.metrics name too; a metric has one source"
            )
        if name in names:
            raise UserError(f"{key}: {name!r} is declared twice")
        names.append(name)
    return tuple(names)


@dataclass
class _MetricFile:
    name: str
    read: int = 0  # bytes of whole lines read


class OwnMetricReader:
    """Reads the metric files of one job's MLflow store, each call what is new."""

    def __init__(self, declared: Collection[str], taken: Collection[str] = ()) -> None:
        """``declared``: ``job.mlflow_metrics``; ``taken``: the names other sources feed."""
        self.declared = tuple(declared)
        self.taken = frozenset(taken)
        self.series: dict[str, list[MetricPoint]] = {name: [] for name in self.declared}
        self.keys: set[str] = set()  # every metric key the store held, read or not
        self._files: dict[Path, _MetricFile] = {}

    def read(self, store: Path | None) -> list[MetricPoint]:
        """The new points in ``store``'s metric files (new runs and metrics included)."""
        if store is None or not store.is_dir():
            return []
        added: list[MetricPoint] = []
        for path, name in _metric_files(store):
            self.keys.add(name)
            if name in self.taken:
                continue
            state = self._files.setdefault(path, _MetricFile(name))
            added.extend(self._read_file(path, state))
        return added

    def _read_file(self, path: Path, state: _MetricFile) -> list[MetricPoint]:
        try:
            with path.open("rb") as stream:
                stream.seek(state.read)
                data = stream.read()
        except OSError:
            return []  # gone, or not readable yet: looked at again next time
        whole = data[: data.rfind(b"\n") + 1]
        state.read += len(whole)
        series = self.series.setdefault(state.name, [])
        added = []
        for line in whole.decode(errors="replace").splitlines():
            point = _point(state.name, line)
            if point is not None:
                series.append(point)
                added.append(point)
        return added

    def final(self) -> dict[str, float]:
        """Each metric's latest value as MLflow tells it: its highest step's, the latest
        logged of that step."""
        return {
            name: max(points, key=lambda p: (p.step, p.timestamp)).value
            for name, points in self.series.items()
            if points
        }

    def missing(self) -> dict[str, str]:
        """Why each declared metric the store never held is missing (naming the metrics it
        did hold), by metric name."""
        logged = ", ".join(sorted(self.keys)) if self.keys else None
        return {
            name: f"the job's own MLflow calls never logged metric {name!r}; "
            + (f"they logged: {logged}" if logged else "they logged no metric")
            for name in self.declared
            if not self.series.get(name)
        }


def _metric_files(store: Path) -> list[tuple[Path, str]]:
    """Each metric file of each run in ``store``, with its metric key, in path order."""
    found: list[tuple[Path, str]] = []
    for experiment in _visible_dirs(store):
        for run in _visible_dirs(experiment):
            metrics = run / METRICS_DIR
            if not metrics.is_dir():
                continue
            for folder, _, names in os.walk(metrics):
                for name in names:
                    path = Path(folder) / name
                    found.append((path, path.relative_to(metrics).as_posix()))
    return sorted(found)


def _visible_dirs(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _point(name: str, line: str) -> MetricPoint | None:
    """A metric file's line as a point, as MLflow's file store reads it
    (``FileStore._get_metric_from_line``: a line of a dataset's five fields is step 0 there,
    and the merge logs what that reader says); None for a line MLflow would refuse (the merge
    says so)."""
    fields = line.strip().split(" ")
    if len(fields) not in (2, 3, 5):
        return None
    try:
        timestamp, value = int(fields[0]), float(fields[1])
        step = int(fields[2]) if len(fields) == 3 else 0
    except ValueError:
        return None
    return MetricPoint(name, value, step, timestamp / 1000)
