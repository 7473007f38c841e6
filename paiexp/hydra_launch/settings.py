"""``hydra.launcher`` of ``hydra/launcher=paiexp``, ``hydra.sweeper`` of ``hydra/sweeper=paiexp``:
where and how each job of a multirun, or trial of a sweep, runs.

The job's fields are a paiexp job's (``conf/job/*.yaml``), less what the launcher makes itself
(the name's suffix, the command, the hyperparameters: the app's config is its own), and are
checked as a job's are before anything is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from paiexp.config.schema import PaiJobType, PrunerConfig, TensorBoardConfig, TrackerConfig
from paiexp.metrics.extraction import MetricDefinition

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
    mlflow_metrics: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    checkpoints: str | None = None


def backend_name(backend: Any) -> str:
    """The backend of ``backend: NAME`` or ``backend: {name: NAME, ...}``."""
    return str(backend if isinstance(backend, str) else backend.get("name", "local"))


@dataclass
class PaiexpLauncherConf:
    """``hydra/launcher=paiexp``."""

    _target_: str = LAUNCHER_TARGET
    # a backend's name (local, docker, pai, openpai), or its settings with `name`
    backend: Any = "local"
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    job: LauncherJobConfig = field(default_factory=LauncherJobConfig)
    parallelism: int | None = None  # jobs at once; null: the CPUs here on local, else all


SWEEPER_TARGET = "hydra_plugins.paiexp_sweeper.paiexp_sweeper.PaiexpSweeper"


@dataclass
class ParzenOptions:
    """The options TPE and MOTPE share, at hydra-optuna-sweeper's defaults."""

    seed: int | None = None
    consider_prior: bool = True
    prior_weight: float = 1.0
    consider_magic_clip: bool = True
    consider_endpoints: bool = False
    n_startup_trials: int = 10


@dataclass
class TPESamplerConf(ParzenOptions):
    """``hydra/sweeper/sampler=tpe``, as hydra-optuna-sweeper spells its samplers: the
    class and the options a user sets (those left at these defaults are Optuna's own)."""

    _target_: str = "optuna.samplers.TPESampler"
    n_ei_candidates: int = 24
    multivariate: bool = False
    warn_independent_sampling: bool = True


@dataclass
class RandomSamplerConf:
    _target_: str = "optuna.samplers.RandomSampler"
    seed: int | None = None


@dataclass
class CmaEsSamplerConf:
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: int | None = None
    x0: dict[str, Any] | None = None
    sigma0: float | None = None
    independent_sampler: Any = None
    warn_independent_sampling: bool = True
    consider_pruned_trials: bool = False
    restart_strategy: Any = None
    inc_popsize: int = 2
    use_separable_cma: bool = False
    source_trials: Any = None


@dataclass
class NSGAIISamplerConf:
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: int | None = None
    population_size: int = 50
    mutation_prob: float | None = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5
    constraints_func: Any = None


@dataclass
class MOTPESamplerConf(ParzenOptions):
    """Optuna 3 folded MOTPE into TPE: run as TPE."""

    _target_: str = "optuna.samplers.MOTPESampler"
    n_ehvi_candidates: int = 24


@dataclass
class GridSamplerConf:
    """Every point of a discrete space (paiexp's brute-force sampler)."""

    _target_: str = "optuna.samplers.GridSampler"
    _partial_: bool = True


@dataclass
class QMCSamplerConf:
    _target_: str = "optuna.samplers.QMCSampler"
    seed: int | None = None


@dataclass
class GPSamplerConf:
    _target_: str = "optuna.samplers.GPSampler"
    seed: int | None = None


SAMPLER_CONFS: dict[str, type] = {
    "tpe": TPESamplerConf,
    "random": RandomSamplerConf,
    "cmaes": CmaEsSamplerConf,
    "nsgaii": NSGAIISamplerConf,
    "motpe": MOTPESamplerConf,
    "grid": GridSamplerConf,
    "qmc": QMCSamplerConf,
    "gp": GPSamplerConf,
}


@dataclass
class PaiexpSweeperConf:
    """``hydra/sweeper=paiexp``: hydra-optuna-sweeper's settings, then paiexp's own."""

    _target_: str = SWEEPER_TARGET
    _recursive_: bool = False  # Hydra instantiates the sweeper alone, never its sampler
    defaults: list[Any] = field(default_factory=lambda: [{"sampler": "tpe"}])
    # {_target_: optuna.samplers.X, seed, ...}: hydra/sweeper/sampler=X (its node, composed
    # before this one, is left as it is)
    sampler: Any = MISSING
    direction: Any = "minimize"  # or a list of them: one per value the task returns
    storage: str | None = None  # null: the project's optuna.journal
    study_name: str | None = None  # null: the app's name
    n_trials: int = 20
    n_jobs: int = 2  # trials at once (each slot refilled as its trial ends)
    max_failure_rate: float = 0.0
    search_space: dict[str, Any] | None = None  # deprecated in that sweeper: use params
    params: dict[str, Any] | None = None
    custom_search_space: str | None = None  # module.function(cfg, trial), adds params
    # null: the task's return value; else a metric the job reports, or {metric, direction}s
    objective: Any = None
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    retries: int = 1
    timeout: float | None = None
    backend: Any = "local"
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    job: LauncherJobConfig = field(default_factory=LauncherJobConfig)
