"""JobSpec: the backend-neutral description of one job, built and validated from the config.

Every check a user mistake can fail happens here (or in a backend's ``validate``), before any
job is submitted or any run is tracked; each failure is a :class:`UserError` naming the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paiexp.contract import job_mlflow
from paiexp.contract import layout as contract
from paiexp.errors import UserError
from paiexp.metrics.extraction import METRIC_NAME, MetricDefinition, definition_error
from paiexp.metrics.own_mlflow import parse_mlflow_metrics
from paiexp.metrics.tensorboard import TensorBoardScalars, parse_tensorboard
from paiexp.util.confine import one_segment
from paiexp.util.redact import redact_environments
from paiexp.util.seconds import check_seconds

JOB_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,39}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OSS_URI = re.compile(r"^oss://[a-z0-9][a-z0-9-]{1,61}[a-z0-9](/.*)?$")


@dataclass(frozen=True)
class JobSpec:
    """What to run, independent of where. Paths are absolute; hyperparameter values strings."""

    name: str
    command: str
    image: str | None = None
    source_dir: str | None = None
    instance_type: str | None = None
    instance_count: int = 1
    job_type: str | None = None  # None: the backend's default (PyTorchJob)
    hyperparameters: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str | None] = field(default_factory=dict)
    environments: dict[str, str] = field(default_factory=dict)
    requirements: tuple[str, ...] = ()
    max_run_time: int | None = None
    metric_definitions: tuple[MetricDefinition, ...] = ()
    tensorboard: TensorBoardScalars = field(default_factory=TensorBoardScalars)
    mlflow_metrics: tuple[str, ...] = ()  # what the job logs with MLflow itself, declared
    labels: dict[str, str] = field(default_factory=dict)
    # the checkpoints the job starts from (an earlier job's): on PAI its checkpoints channel,
    # as the SDK's ``checkpoints_path``; elsewhere copied into its checkpoints directory
    checkpoints: str | None = None

    @property
    def metric_names(self) -> list[str]:
        """The metrics the job declares (an objective, a pruner, a condition may name them):
        its log's, its TensorBoard scalars', then those of its own MLflow calls."""
        return [
            *(d.name for d in self.metric_definitions),
            *(m.name for m in self.tensorboard.metrics),
            *self.mlflow_metrics,
        ]

    @property
    def output_channels(self) -> list[str]:
        """The standard output channels plus the job's extra ones."""
        extra = [name for name in self.outputs if name not in contract.OUTPUT_CHANNELS]
        return [*contract.OUTPUT_CHANNELS, *extra]

    @property
    def output_dirs(self) -> list[str]:
        """Every directory the job finds under ``/ml/output``: its output channels,
        ``output_parameters`` (one file per number it reports) and its own MLflow store."""
        return [*self.output_channels, *contract.RESERVED_OUTPUTS]

    def to_dict(self, *, redact: bool = False) -> dict[str, Any]:
        """Plain data; ``redact`` replaces secret-looking environment values by references."""
        data = asdict(self)
        if redact:
            data["environments"] = redact_environments(data["environments"])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec stored as :meth:`to_dict` made it; its names, which become file names, are
        checked (a stored run is outside data)."""
        values = dict(data)
        one_segment(values["name"], what="job name")
        for channel in (*values.get("inputs", {}), *values.get("outputs", {})):
            one_segment(channel, what=f"job {values['name']}: channel")
        values["requirements"] = tuple(values.get("requirements", ()))
        values["metric_definitions"] = tuple(
            MetricDefinition(**item) for item in values.get("metric_definitions", ())
        )
        values["tensorboard"] = TensorBoardScalars.from_dict(values.get("tensorboard") or {})
        values["mlflow_metrics"] = tuple(values.get("mlflow_metrics", ()))
        return cls(**values)


def build_spec(job: Any, *, name: str, base_dir: Path) -> JobSpec:
    """Validate a composed ``job`` config (a JobConfig) and turn it into a JobSpec.

    Relative paths in the config are taken relative to ``base_dir`` (the project directory).
    """
    if not JOB_NAME.match(job.name):
        _fail("job.name", job.name, "1-40 letters, digits or '-', starting with a letter")
    if not job.command or not job.command.strip():
        raise UserError("job.command: must not be empty")
    if job.instance_count < 1:
        _fail("job.instance_count", job.instance_count, "a whole number >= 1")
    check_seconds("job.max_run_time", job.max_run_time, null=True)
    for written in job.output_parameters:
        if not METRIC_NAME.match(str(written)):
            _fail("job.output_parameters", written, "names of letters, digits, '_', '-', '.', '/'")
    metric_definitions = _metric_definitions(job.metric_definitions)
    tensorboard = parse_tensorboard(
        job.tensorboard.metrics,
        job.tensorboard.other_scalars,
        {d.name for d in metric_definitions},
    )
    mlflow_metrics = parse_mlflow_metrics(
        job.mlflow_metrics,
        {d.name for d in metric_definitions} | {m.name for m in tensorboard.metrics},
    )
    return JobSpec(
        name=name,
        command=job.command,
        image=job.image,
        source_dir=_source_dir(job.source_dir, base_dir),
        instance_type=job.instance_type,
        instance_count=job.instance_count,
        job_type=str(job.job_type) if job.job_type else None,
        hyperparameters=validate_hyperparameters(job.hyperparameters),
        inputs=_inputs(job.inputs, base_dir),
        outputs=_outputs(job.outputs, base_dir),
        environments=_environments(job.environments),
        requirements=tuple(str(item) for item in job.requirements),
        max_run_time=job.max_run_time,
        metric_definitions=metric_definitions,
        tensorboard=tensorboard,
        mlflow_metrics=mlflow_metrics,
        labels=_labels(job.labels),
        checkpoints=_checkpoints(job.checkpoints, base_dir),
    )


def _fail(key: str, value: Any, valid: str) -> None:
    raise UserError(f"{key}: invalid value {value!r}; expected {valid}")


def _source_dir(source_dir: str | None, base_dir: Path) -> str | None:
    if source_dir is None:
        return None
    path = usable_path("job.source_dir", source_dir, base_dir)
    if not path.is_dir():
        raise UserError(f"job.source_dir: {source_dir!r} is not a directory (looked at {path})")
    return str(path)


def usable_path(key: str, path: str, base_dir: Path) -> Path:
    """A local path of the config made absolute from ``base_dir``; one no file system can
    hold (a NUL character, a name too long) is a UserError naming ``key``."""
    try:
        absolute = (base_dir / path).resolve()
        absolute.exists()  # asks the file system about the name itself
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(f"{key}: {path!r} is not a usable path ({reason})") from None
    return absolute


def creatable_path(key: str, path: str, base_dir: Path) -> Path:
    """A path of the config that paiexp makes (its directories too) as :func:`usable_path`
    returns it; one whose nearest existing directory it cannot write in is a UserError."""
    absolute = usable_path(key, path, base_dir)
    if absolute.exists():
        return absolute  # what it is, the caller checks
    existing = next(parent for parent in absolute.parents if parent.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(
            f"{key}: {path!r} cannot be made: {str(existing)!r} is not a writable directory"
        )
    return absolute


def validate_hyperparameters(tree: Mapping[str, Any]) -> dict[str, str]:
    """Flatten and check ``job.hyperparameters``; values become PAI's strings."""
    values: dict[str, str] = {}
    for name, value in contract.flatten_hyperparameters(tree).items():
        key = f"job.hyperparameters.{name}"
        if not contract.HYPERPARAMETER_NAME.match(name):
            _fail(key, name, "a name of letters, digits, '_', '-' or '.'")
        if value is None or not isinstance(value, str | int | float | bool):
            _fail(key, value, "a string, number or boolean")
        values[name] = contract.format_value(value)
    return values


def _check_channel(key: str, channel: str) -> None:
    if not contract.CHANNEL_NAME.match(channel):
        _fail(key, channel, "a channel name of letters, digits and '_', starting with a letter")


def _inputs(inputs: Mapping[str, str], base_dir: Path) -> dict[str, str]:
    resolved: dict[str, str] = {}
    for channel, uri in inputs.items():
        key = f"job.inputs.{channel}"
        _check_channel("job.inputs", channel)
        if not isinstance(uri, str):
            _fail(key, uri, "a local path or an oss://BUCKET/path URI")
        if uri.startswith("oss://"):
            if not OSS_URI.match(uri):
                _fail(key, uri, "oss://BUCKET/path with a valid bucket name")
            resolved[channel] = uri
            continue
        path = usable_path(key, local_path(uri), base_dir)
        if not path.exists():
            raise UserError(f"{key}: input path {uri!r} does not exist (looked at {path})")
        resolved[channel] = str(path)
    return resolved


def local_path(uri: str) -> str:
    """A local input's path: a ``file://`` URI (how local backends name a job's outputs, which
    a pipeline's later step may take as an input) becomes its path."""
    if not uri.startswith("file://"):
        return uri
    from urllib.parse import unquote, urlsplit

    return unquote(urlsplit(uri).path)


def _outputs(outputs: Mapping[str, str | None], base_dir: Path) -> dict[str, str | None]:
    resolved: dict[str, str | None] = {}
    for channel, uri in outputs.items():
        _check_channel("job.outputs", channel)
        if channel in contract.RESERVED_OUTPUTS:
            reserved = ", ".join(contract.RESERVED_OUTPUTS)
            _fail("job.outputs", channel, f"a channel other than paiexp's own ({reserved})")
        if uri is not None and not isinstance(uri, str):
            _fail(f"job.outputs.{channel}", uri, "a local path, an oss://BUCKET/path URI or null")
        if uri is None or uri.startswith("oss://"):
            if uri is not None and not OSS_URI.match(uri):
                _fail(f"job.outputs.{channel}", uri, "oss://BUCKET/path with a valid bucket name")
            resolved[channel] = uri
        else:
            resolved[channel] = str(usable_path(f"job.outputs.{channel}", uri, base_dir))
    return resolved


def _checkpoints(uri: str | None, base_dir: Path) -> str | None:
    """``job.checkpoints``: an ``oss://`` URI as it is, a local directory resolved."""
    if uri is not None and not isinstance(uri, str):
        _fail("job.checkpoints", uri, "an existing directory, an oss:// URI or null")
    if uri is None or uri.startswith("oss://"):
        if uri is not None and not OSS_URI.match(uri):
            _fail("job.checkpoints", uri, "oss://BUCKET/path with a valid bucket name")
        return uri
    path = usable_path("job.checkpoints", local_path(uri), base_dir)
    if not path.is_dir():
        _fail("job.checkpoints", uri, "an existing directory or an oss:// URI")
    return str(path)


def _environments(environments: Mapping[str, str]) -> dict[str, str]:
    for name in environments:
        if not ENV_NAME.match(name):
            _fail("job.environments", name, "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name.startswith("PAI_"):
            _fail("job.environments", name, "a name not starting with PAI_ (the contract's own)")
        if name in job_mlflow.ROUTING:
            _fail("job.environments", name, "a name other than those paiexp gives a job's MLflow")
    return {name: str(value) for name, value in environments.items()}


def _metric_definitions(definitions: Any) -> tuple[MetricDefinition, ...]:
    result: list[MetricDefinition] = []
    seen: set[str] = set()
    for index, item in enumerate(definitions):
        definition = MetricDefinition(name=item.name, regex=item.regex)
        problem = definition_error(definition)
        if problem:
            raise UserError(f"job.metric_definitions[{index}]: {problem}")
        if definition.name in seen:
            raise UserError(
                f"job.metric_definitions[{index}]: metric name {definition.name!r} is defined twice"
            )
        seen.add(definition.name)
        result.append(definition)
    return tuple(result)


def _labels(labels: Mapping[str, str]) -> dict[str, str]:
    for key in labels:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$", key):
            _fail("job.labels", key, "a label key of letters, digits, '_', '-', '.' or '/'")
    return {key: str(value) for key, value in labels.items()}
