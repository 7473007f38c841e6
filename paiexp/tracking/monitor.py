"""Watching one job: its log read from a cursor, metrics extracted as lines arrive (and as
its TensorBoard event files grow), the result.

A launcher polls all its jobs' statuses in one backend call and then asks each job's monitor
for new log lines; a single run is the same with one job.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from paiexp.backends.base import Backend, JobHandle, JobState, JobStatus
from paiexp.config.spec import JobSpec
from paiexp.contract import job_mlflow
from paiexp.metrics.extraction import MetricExtractor, MetricPoint
from paiexp.metrics.own_mlflow import OwnMetricReader
from paiexp.metrics.tensorboard import ScalarReader
from paiexp.tracking.cost import RunCost

LOG_TAIL_LINES = 50
OwnMetrics = Literal["logged", "read", "none"]  # see JobMonitor
# labels a job that writes no model by design with (a Hydra app's): no warning when it writes none
NO_MODEL_LABEL = ("paiexp-model", "none")


def job_log(base_dir: Path, job_name: str) -> Path:
    """The launcher's local copy of a job's log, in the project at ``base_dir``."""
    return base_dir / ".paiexp" / "logs" / f"{job_name}.log"


@dataclass
class JobResult:
    handle: JobHandle
    status: JobStatus
    metrics: dict[str, float]
    series: dict[str, list[MetricPoint]]
    output_parameters: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    console_url: str | None = None
    log_path: Path | None = None
    log_tail: list[str] = field(default_factory=list)
    # a multi-instance job's logs by instance name (master-0, worker-0, ...)
    instance_logs: dict[str, Path] = field(default_factory=dict)
    # metric -> (from the log, from the platform) where the two disagree
    mismatches: dict[str, tuple[float, float]] = field(default_factory=dict)
    # what a person should know although the job succeeded (one line each)
    warnings: list[str] = field(default_factory=list)
    # why a declared metric has no value, by its name (TensorBoard scalars never written)
    unreported: dict[str, str] = field(default_factory=dict)
    model_empty: bool = False  # it succeeded, leaving its model channel empty
    cost: RunCost | None = None  # its instance-hours and price (see paiexp.tracking.cost)

    @property
    def model_uri(self) -> str | None:
        return self.outputs.get("model")


class JobMonitor:
    """Incremental log reader of one job; keeps a local copy of the log for tracking."""

    def __init__(
        self,
        backend: Backend,
        handle: JobHandle,
        spec: JobSpec,
        log_path: Path,
        echo: Callable[[str], None] | None = None,
        logged: Mapping[str, Collection[int]] | None = None,
        own_metrics: OwnMetrics = "logged",
    ) -> None:
        """``logged``: the steps of each metric its run holds already (a re-attached job's
        log is read from its start again; those steps are not logged twice).
        ``own_metrics``: what becomes of the metrics of the job's own MLflow calls: read from
        its store and ``logged`` with the rest; ``read`` only (its store is merged into its
        run, see :class:`paiexp.runs.OwnStore`); or ``none`` (its calls write its run
        directly: there is no store to read)."""
        self.own_metrics = own_metrics
        self.backend = backend
        self.logged = dict(logged or {})
        self.handle = handle
        self.spec = spec
        self.log_path = log_path
        self.echo = echo
        self.cursor = 0
        self.extractor = MetricExtractor(spec.metric_definitions)
        self.scalars = ScalarReader(spec.tensorboard, taken=self.extractor.series)
        self.own = OwnMetricReader(
            spec.mlflow_metrics if own_metrics != "none" else (),
            taken=[*self.extractor.series, *(m.name for m in spec.tensorboard.metrics)],
        )
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.unlogged: list[MetricPoint] = []
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")

    def pull(self, *, final: bool = False) -> list[MetricPoint]:
        """Read new log lines, TensorBoard scalars and the job's own MLflow metrics; returns
        the metric points they held."""
        handle, backend = self.handle, self.backend
        points = self._pull_log(final)
        points += self.scalars.read(backend.tensorboard_dir(handle, final=final))
        own = []
        if self.own_metrics != "none":
            own = self.own.read(backend.own_mlflow_dir(handle, final=final))
        loggable = points + own if self.own_metrics == "logged" else points
        self.unlogged.extend(p for p in loggable if p.step not in self.logged.get(p.name, ()))
        return points + own

    def _pull_log(self, final: bool) -> list[MetricPoint]:
        chunk = self.backend.read_logs(self.handle, self.cursor, final=final)
        self.cursor = chunk.cursor
        if not chunk.lines:
            return []
        try:
            with self.log_path.open("a", encoding="utf-8") as stream:
                stream.writelines(line + "\n" for line in chunk.lines)
        except OSError as exc:  # a write's or a close's error names no file: a full disk's
            exc.filename = exc.filename or str(self.log_path)
            raise
        self.tail.extend(chunk.lines)
        if self.echo is not None:
            for line in chunk.lines:
                self.echo(line)
        return self.extractor.feed(chunk.lines)

    def take_unlogged(self) -> list[MetricPoint]:
        points, self.unlogged = self.unlogged, []
        return points

    def result(self, status: JobStatus) -> JobResult:
        """The job's outcome; call after a final :meth:`pull` once the job is terminal."""
        output_parameters = self.backend.output_parameters(self.handle)
        extracted = {**self.own.final(), **self.extractor.final(), **self.scalars.final()}
        reported = self.backend.service_metrics(self.handle)
        mismatches = {
            name: (extracted[name], value)
            for name, value in reported.items()
            if name in extracted and not math.isclose(extracted[name], value, rel_tol=1e-6)
        }
        outputs = self.backend.outputs(self.handle)
        empty = self.model_left_empty(status, outputs)
        own = empty and self.logged_its_own_model()
        key, value = NO_MODEL_LABEL
        warn_empty = empty and not own and self.spec.labels.get(key) != value
        unreported = {**self.scalars.missing(), **self.own.missing()}
        return JobResult(
            handle=self.handle,
            status=status,
            # the platform's values fill in what the log (read client-side) missed
            metrics={**reported, **extracted, **output_parameters},
            mismatches=mismatches,
            series={**self.own.series, **self.extractor.series, **self.scalars.series},
            output_parameters=output_parameters,
            outputs=outputs,
            console_url=self.backend.console_url(self.handle),
            log_path=self.log_path,
            log_tail=list(self.tail),
            instance_logs=self.backend.instance_logs(self.handle),
            warnings=[
                *self.scalars.unreadable(),
                *(
                    f"{'MLflow' if name in self.own.declared else 'TensorBoard'} "
                    f"metric {name!r}: {why}"
                    for name, why in unreported.items()
                    if status.state is JobState.SUCCEEDED
                ),
                *([self.empty_model_warning(outputs["model"])] if warn_empty else []),
            ],
            model_empty=empty,
            unreported=unreported,
        )

    def model_left_empty(self, status: JobStatus, outputs: Mapping[str, str]) -> bool:
        """Whether a job that succeeded left its model channel empty: its model URI would point
        at nothing (a script that wrote its model somewhere else than ``/ml/output/model``)."""
        if status.state is not JobState.SUCCEEDED or outputs.get("model") is None:
            return False
        return self.backend.output_is_empty(self.handle, "model")

    def logged_its_own_model(self) -> bool:
        """Whether the job logged a model with its own MLflow calls, in its store (its run's
        model then: an empty model channel is no mistake)."""
        store = self.backend.own_mlflow_dir(self.handle, final=True)
        return store is not None and job_mlflow.holds_logged_model(store)

    def empty_model_warning(self, model: str) -> str:
        return (
            f"job {self.handle.name} succeeded but left its model channel empty ({model}):"
            " write the model under $PAI_OUTPUT_MODEL (/ml/output/model)"
        )
