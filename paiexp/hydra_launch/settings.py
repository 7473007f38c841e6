"""``hydra.launcher`` of ``hydra/launcher=paiexp``: where and how each job of a multirun runs.

The job's fields are a paiexp job's (``conf/job/*.yaml``), less what the launcher makes itself
(the name's suffix, the command, the hyperparameters: the app's config is its own), and are
checked as a job's are before anything is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paiexp.config import PaiJobType, TensorBoardConfig, TrackerConfig
from paiexp.metrics import MetricDefinition

LAUNCHER_TARGET = "hydra_plugins.paiexp_launcher.paiexp_launcher.PaiexpLauncher"


@dataclass
class LauncherJobConfig:
    """Each job of the multirun, as a paiexp job."""

    name: str | None = None  # null: the app's task name
    image: str | None = None
    source_dir: str | None = None  # the app's code; null: the directory the app started in
    python: str = "python"  # the job's interpreter, as its image names it
    instance_type: str | None = None
    instance_count: int = 1
    job_type: PaiJobType | None = None
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str | None] = field(default_factory=dict)
    environments: dict[str, str] = field(default_factory=dict)
    requirements: list[str] = field(default_factory=list)
    max_run_time: int | None = None
    metric_definitions: list[MetricDefinition] = field(default_factory=list)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    labels: dict[str, str] = field(default_factory=dict)
    checkpoints: str | None = None


@dataclass
class PaiexpLauncherConf:
    """``hydra/launcher=paiexp``."""

    _target_: str = LAUNCHER_TARGET
    # a backend's name (local, docker, pai, openpai), or its settings with `name`
    backend: Any = "local"
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    job: LauncherJobConfig = field(default_factory=LauncherJobConfig)
    parallelism: int | None = None  # jobs at once; null: the CPUs here on local, else all
