"""Typed configuration schema, registered in Hydra's ConfigStore.

The YAML files under a project's ``conf/`` are validated against these dataclasses: an unknown
key or a value of the wrong type is an error at composition time.  Schemas live in the
``schema/...`` groups so that they never show up as selectable options (``backend=...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from paiexp.metrics.extraction import MetricDefinition

# Fixed choices.  OmegaConf matches a YAML string to an Enum member by NAME: names equal values.


class InstallMode(StrEnum):
    """When a backend on this machine pip-installs a job's requirements."""

    auto = "auto"  # only when the environment does not satisfy them already
    always = "always"
    never = "never"


class InterruptMode(StrEnum):
    """What Ctrl-C does to a sweep's running jobs."""

    stop = "stop"
    detach = "detach"  # leave them running; resume the sweep later


class Direction(StrEnum):
    minimize = "minimize"
    maximize = "maximize"


class PaiJobType(StrEnum):
    """AlgorithmSpec.JobType of a PAI training job."""

    PyTorchJob = "PyTorchJob"
    TFJob = "TFJob"
    XGBoostJob = "XGBoostJob"
    MPIJob = "MPIJob"
    OneFlowJob = "OneFlowJob"
    ElasticBatchJob = "ElasticBatchJob"


class SpotStrategy(StrEnum):
    """ComputeResource.SpotSpec.SpotStrategy."""

    SpotWithPriceLimit = "SpotWithPriceLimit"
    SpotAsPriceGo = "SpotAsPriceGo"


class Scheme(StrEnum):
    """How the PAI API is reached."""

    https = "https"
    http = "http"


@dataclass
class TensorBoardConfig:
    """The scalars of the job's TensorBoard event files (its ``tensorboard`` channel) as
    metrics (see :mod:`paiexp.metrics.tensorboard`)."""

    # declared scalars (an objective, a pruner or a condition may name them): a tag path,
    # or {name: NAME, tag: TAG} (e.g. {name: val_loss, tag: validation/epoch_loss})
    metrics: list[Any] = field(default_factory=list)
    other_scalars: bool = True  # every other scalar too, named by its tag path


@dataclass
class JobConfig:
    """One training job, in the terms of a PAI training job."""

    name: str = MISSING
    command: str = MISSING
    image: str | None = None
    source_dir: str | None = None
    instance_type: str | None = None
    instance_count: int = 1
    # PAI's job type, on every backend (the distributed variables of a multi-instance job
    # depend on it); null: backend.job_type on backend=pai, else PyTorchJob.
    job_type: PaiJobType | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str | None] = field(default_factory=dict)
    environments: dict[str, str] = field(default_factory=dict)
    requirements: list[str] = field(default_factory=list)
    max_run_time: int | None = None
    metric_definitions: list[MetricDefinition] = field(default_factory=list)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    # metrics the job logs with MLflow itself (mlflow.log_metric, autolog) that an objective,
    # a pruner or a condition may name; read as the job runs (see paiexp.metrics.own_mlflow)
    mlflow_metrics: list[str] = field(default_factory=list)
    # the names the job writes to output_parameters/ (a pipeline's references are checked
    # against them and metric_definitions before anything runs)
    output_parameters: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    # checkpoints to start from: an earlier job's checkpoints URI (oss:// on PAI, a path
    # elsewhere), which the job finds in /ml/output/checkpoints
    checkpoints: str | None = None


@dataclass
class PricesConfig:
    """What an instance costs per hour, by instance type (``job.instance_type``), in
    ``currency``: none are shipped; see the README's "What it costs"."""

    currency: str | None = None  # e.g. CNY; needed once a price is set
    per_hour: dict[str, float] = field(default_factory=dict)  # e.g. {ecs.g6.2xlarge: 2.02}


@dataclass
class LocalBackendConfig:
    """Plain local processes that mirror the PAI ``/ml`` layout under ``root``."""

    name: str = "local"
    prices: PricesConfig = field(default_factory=PricesConfig)
    root: str = ".paiexp/jobs"
    poll_interval: float = 0.2
    stop_grace_period: float = 10.0
    install_requirements: InstallMode = InstallMode.auto
    warm_start: bool = True  # a sweep forks `python SCRIPT` jobs from a warm interpreter
    warm_imports: list[str] = field(default_factory=list)  # imported there besides SCRIPT's


@dataclass
class OssAccessConfig:
    """Where a local backend reads ``oss://`` inputs from (credentials: env/chain only)."""

    endpoint: str | None = None  # null: oss-<region>.aliyuncs.com
    region: str = "cn-hangzhou"


@dataclass
class DockerBackendConfig:
    """Local containers laid out like PAI training jobs: the real ``/ml`` paths, limits."""

    name: str = "docker"
    prices: PricesConfig = field(default_factory=PricesConfig)
    image: str | None = None  # overrides job.image (a local stand-in for the PAI image)
    root: str = ".paiexp/docker"
    poll_interval: float = 0.5
    stop_grace_period: float = 10.0
    keep_containers: bool = False
    # Override job.instance_type's limits: cpus (e.g. 1.5), memory (512m, 4g), gpus (0: none).
    cpus: float | None = None
    memory: str | None = None
    gpus: int | None = None
    install_requirements: InstallMode = InstallMode.auto
    network: str | None = None  # a Docker network (none, host, ...); null: the default bridge
    oss: OssAccessConfig = field(default_factory=OssAccessConfig)  # for oss:// inputs


@dataclass
class TrackerConfig:
    """MLflow tracking; ``uri`` null means MLflow's own default (``sqlite:///mlflow.db``)."""

    uri: str | None = None
    experiment: str = "paiexp"
    # Seconds a sweep waits for a tracking server that stopped answering mid-sweep (its writes
    # queue in order meanwhile, trials go on); then it stops submitting, and the next launch
    # writes what is missing.
    outage_timeout: float = 600.0
    # The tracking server of ``uri`` as jobs reach it (http(s)); set, a single run's job writes
    # its own MLflow calls into its run there itself.  Null: they go to a store in its outputs,
    # merged into its run (paiexp.contract.job_mlflow).
    job_uri: str | None = None


@dataclass
class SamplerConfig:
    """An Optuna sampler: ``name`` (tpe, random, cmaes, gp, qmc, nsgaii, ...) and its options."""

    name: str = "tpe"
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PrunerConfig:
    """An Optuna pruner fed with one metric's step series from the job's log.

    ``direction`` is that metric's own (``validation-logloss`` is minimized even when the
    objective is maximized); paiexp flips its sign when it differs from the study's.
    """

    name: str = "none"
    metric: str | None = None
    direction: Direction | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepConfig:
    """An Optuna study over the job: see ``sweeps/*.yaml`` and the README."""

    name: str = MISSING
    # {metric, direction} or a list of them (multi-objective)
    objective: Any = MISSING
    params: dict[str, Any] = field(default_factory=dict)
    n_trials: int = 20
    parallelism: int = 1
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    # An RDB URL (sqlite:///..., postgresql://...) or a journal file path (default).
    storage: str = "optuna.journal"
    # Seconds a launcher on another host may go without a heartbeat (written every quarter
    # of this) before another launcher sharing the study adopts its running trials.
    heartbeat_grace: float = 60.0
    # Seconds a launcher waits for a study storage on a database server that stopped
    # answering mid-sweep (its jobs run on; the trials that finish meanwhile are told after).
    storage_outage_timeout: float = 300.0
    study_name: str | None = None
    timeout: float | None = None
    max_failures: int | None = None
    # Budgets: no new trial once what is spent plus what the running trials (and the next)
    # may at most spend would pass them; money (backend.prices' currency) or instance-hours.
    max_cost: float | None = None
    max_instance_hours: float | None = None
    retries: int = 1
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    on_interrupt: InterruptMode = InterruptMode.stop
    # A registered model: the best trial's model becomes a version of it (alias best: the
    # best version so far).
    register: str | None = None


@dataclass
class PaiOssConfig:
    """Where paiexp keeps code, local inputs and outputs: ``oss://<bucket>/<prefix>/...``."""

    bucket: str | None = None
    # null: the region's public endpoint (oss-<region>.aliyuncs.com); a URL for VPC/emulators.
    endpoint: str | None = None
    prefix: str = "paiexp"


@dataclass
class PaiSpotConfig:
    """Spot instances (ComputeResource.SpotSpec); ``strategy`` null means on-demand."""

    strategy: SpotStrategy | None = None
    discount_limit: float | None = None  # with SpotWithPriceLimit, e.g. 0.5 for 50%


@dataclass
class PaiVpcConfig:
    """Attach the job to your VPC (UserVpc), to reach NAS, databases, private registries."""

    vpc_id: str | None = None
    switch_id: str | None = None
    security_group_id: str | None = None
    extended_cidrs: list[str] = field(default_factory=list)
    default_route: str | None = None


@dataclass
class PaiRetryConfig:
    """Throttling, 5xx and connection errors: capped exponential backoff with full jitter."""

    attempts: int = 8
    base_delay: float = 0.5
    max_delay: float = 30.0


@dataclass
class PaiBackendConfig:
    """PAI training jobs through the PaiStudio TrainingJob API (credentials: env/chain only)."""

    name: str = "pai"
    prices: PricesConfig = field(default_factory=PricesConfig)
    region: str = "cn-hangzhou"
    workspace_id: str | None = None
    # null: pai.<region>.aliyuncs.com; set for VPC endpoints (pai-vpc.<region>...) or emulators.
    endpoint: str | None = None
    # AIWorkspace API (image listing); null: aiworkspace.<region>.aliyuncs.com, or ``endpoint``.
    workspace_endpoint: str | None = None
    protocol: Scheme = Scheme.https
    image: str | None = None  # overrides job.image
    job_type: PaiJobType = PaiJobType.PyTorchJob
    oss: PaiOssConfig = field(default_factory=PaiOssConfig)
    spot: PaiSpotConfig = field(default_factory=PaiSpotConfig)
    vpc: PaiVpcConfig = field(default_factory=PaiVpcConfig)
    retry: PaiRetryConfig = field(default_factory=PaiRetryConfig)
    poll_interval: float = 10.0  # one ListTrainingJobs call per tick covers every job
    log_interval: float = 10.0  # how often a running job's new log lines are fetched (live curves)
    request_timeout: float = 30.0


@dataclass
class OpenPaiStorageConfig:
    """An OpenPAI storage config: jobs mount it at ``/mnt/<name>``; this machine at
    ``local_path``, where code and local inputs are staged and outputs read back."""

    name: str | None = None  # a storage config of the cluster (GET /api/v2/storages)
    local_path: str | None = None  # where the same storage is mounted here
    prefix: str = "paiexp"  # paiexp's files under it: <prefix>/jobs/<job>, <prefix>/inputs


@dataclass
class OpenPaiBackendConfig:
    """OpenPAI jobs through REST API v2 (token: OPENPAI_TOKEN or a cluster alias; never here)."""

    name: str = "openpai"
    prices: PricesConfig = field(default_factory=PricesConfig)
    # An alias of ~/.openpai/clusters.yaml (openpaisdk's): its pai_uri, user and token.
    cluster_alias: str | None = None
    rest_server_uri: str | None = None  # e.g. https://pai.example.com/rest-server
    web_portal_uri: str | None = None  # null: rest_server_uri without /rest-server
    user: str | None = None
    virtual_cluster: str = "default"
    image: str | None = None  # overrides job.image
    storage: OpenPaiStorageConfig = field(default_factory=OpenPaiStorageConfig)
    job_retry_count: int = 0
    # Override job.instance_type's resources: cpus, memory (512m, 4g), gpus.
    cpus: int | None = None
    memory: str | None = None
    gpus: int | None = None
    install_requirements: InstallMode = InstallMode.auto
    retry: PaiRetryConfig = field(default_factory=PaiRetryConfig)
    poll_interval: float = 10.0  # one job listing per tick covers every job
    log_interval: float = 10.0  # how often a running job's new log lines are fetched (live curves)
    request_timeout: float = 30.0


@dataclass
class StepConfig:
    """A pipeline's step: the project's job (or ``job: NAME``, conf/job/NAME.yaml) or a sweep
    (``sweep: NAME``), with ``overrides`` merged on top; see ``pipelines/*.yaml``."""

    job: str | None = None
    sweep: str | None = None
    depends: list[str] = field(default_factory=list)
    when: str | None = None  # a condition over earlier steps' results (paiexp.pipeline.condition)
    # config keys -> values; may refer to earlier steps' results: ${steps.NAME.outputs.model}
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class PipelineConfig:
    """Steps run in dependency order, each on its condition: see ``pipelines/*.yaml``."""

    name: str = MISSING
    steps: dict[str, StepConfig] = field(default_factory=dict)


@dataclass
class Config:
    job: JobConfig = MISSING
    backend: Any = MISSING
    tracker: TrackerConfig = MISSING
    sweep: SweepConfig | None = None
    pipeline: PipelineConfig | None = None


@dataclass(frozen=True)
class BackendKind:
    """A backend paiexp knows: its config schema, and where its class lives (imported only
    when the backend is used, so that a config mistake never loads a cloud SDK)."""

    schema: type
    module: str
    class_name: str


# The one list of backends: ``backend.name`` -> what it is.
BACKENDS: dict[str, BackendKind] = {
    "local": BackendKind(LocalBackendConfig, "paiexp.backends.local", "LocalBackend"),
    "pai": BackendKind(PaiBackendConfig, "paiexp.backends.pai", "PaiBackend"),
    "docker": BackendKind(DockerBackendConfig, "paiexp.backends.docker", "DockerBackend"),
    "openpai": BackendKind(OpenPaiBackendConfig, "paiexp.backends.openpai", "OpenPaiBackend"),
}


def register_configs() -> None:
    """Register the schema nodes that ``conf/`` files name in their defaults lists."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="paiexp_schema", node=Config)
    for name, kind in BACKENDS.items():
        store.store(group="schema/backend", name=name, node=kind.schema)
