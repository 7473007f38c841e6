"""Typed configuration schema, registered in Hydra's ConfigStore.

The YAML files under a project's ``conf/`` are validated against these dataclasses: an unknown
key or a value of the wrong type is an error at composition time.  Schemas live in the
``schema/...`` groups so that they never show up as selectable options (``backend=...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from paiexp.metrics import MetricDefinition


@dataclass
class JobConfig:
    """One training job, in the terms of a PAI training job."""

    name: str = MISSING
    command: str = MISSING
    image: str | None = None
    source_dir: str | None = None
    instance_type: str | None = None
    instance_count: int = 1
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str | None] = field(default_factory=dict)
    environments: dict[str, str] = field(default_factory=dict)
    requirements: list[str] = field(default_factory=list)
    max_run_time: int | None = None
    metric_definitions: list[MetricDefinition] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class LocalBackendConfig:
    """Plain local processes that mirror the PAI ``/ml`` layout under ``root``."""

    name: str = "local"
    root: str = ".paiexp/jobs"
    poll_interval: float = 0.05
    stop_grace_period: float = 10.0
    # auto: pip-install only requirements the current environment does not satisfy.
    install_requirements: str = "auto"


@dataclass
class TrackerConfig:
    """MLflow tracking; ``uri`` null means MLflow's own default (``sqlite:///mlflow.db``)."""

    uri: str | None = None
    experiment: str = "paiexp"


@dataclass
class Config:
    job: JobConfig = MISSING
    backend: Any = MISSING
    tracker: TrackerConfig = MISSING


BACKEND_SCHEMAS: dict[str, type] = {"local": LocalBackendConfig}


def register_configs() -> None:
    """Register the schema nodes that ``conf/`` files name in their defaults lists."""
    store = ConfigStore.instance()
    store.store(name="paiexp_schema", node=Config)
    for name, schema in BACKEND_SCHEMAS.items():
        store.store(group="schema/backend", name=name, node=schema)
