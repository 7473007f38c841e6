"""The Python API's jobs: composed as the command line composes them (or from keyword
arguments alone), run blocking or not on any backend, tracked exactly as the CLI tracks
them, and a handle on each: status, wait, stop, log, metrics, outputs, model, download.

Cheap to import: Hydra, MLflow and the backends load when a job is composed or run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from paiexp.errors import ConfigError, UserError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from paiexp.backends import Backend, JobHandle
    from paiexp.config.compose import Project
    from paiexp.config.schema import Config
    from paiexp.config.spec import JobSpec
    from paiexp.pipeline.prepare import PreparedPipeline
    from paiexp.runs import PreparedJob
    from paiexp.sweep.prepared import PreparedSweep
    from paiexp.sweep.spending import Projection
    from paiexp.tracking.mlflow_tracker import MlflowTracker
    from paiexp.tracking.monitor import JobResult

P = ParamSpec("P")
R = TypeVar("R")


def user_errors(call: Callable[P, R]) -> Callable[P, R]:
    """An API call whose user mistakes raise :class:`ConfigError`, with the CLI's one line."""

    @functools.wraps(call)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        except ConfigError:
            raise
        except UserError as exc:
            raise ConfigError(str(exc)) from None

    return checked


@dataclass(frozen=True)
class Composed:
    """A composed, validated config: a job's, or a sweep's or pipeline's (``kind``)."""

    cfg: DictConfig
    base_dir: Path
    overrides: tuple[str, ...] = ()
    project: Project | None = field(default=None, repr=False)  # None: from keyword arguments

    @property
    def kind(self) -> str:
        """``job``, ``sweep`` or ``pipeline``."""
        if self.cfg.get("pipeline") is not None:
            return "pipeline"
        return "sweep" if self.cfg.get("sweep") is not None else "job"

    @functools.cached_property
    def config(self) -> Config:
        """The config as its typed schema, interpolations resolved (a pipeline's steps refer
        to results that do not exist yet: they resolve as each step runs)."""
        from paiexp.config.compose import to_object

        return to_object(self.cfg)

    @property
    def spec(self) -> JobSpec:
        """The job as it would be submitted."""
        return self.prepared().spec

    def prepared(self) -> PreparedJob:
        """A job's every check made: what :func:`run_prepared` submits."""
        from paiexp.runs import prepare_config

        return prepare_config(self.cfg, self.base_dir, self.overrides)

    def prepared_sweep(self) -> PreparedSweep:
        """A sweep's every check made: what :func:`paiexp.api.sweeps.run_prepared_sweep` runs."""
        from paiexp.sweep.prepared import prepare_sweep

        return prepare_sweep(self.cfg, self.config, self.base_dir, self.overrides)

    def projection(self) -> Projection:
        """The most a sweep (or a job) can cost, nothing launched: ``.line()`` says it,
        ``.total`` is a :class:`paiexp.tracking.cost.RunCost` (None: no job.max_run_time bounds
        it)."""
        from paiexp.sweep.spending import projection
        from paiexp.tracking.cost import prices_of

        if self.kind == "pipeline":
            raise UserError("projection: a pipeline's cost is not projected; its steps' are")
        if self.kind == "sweep":
            return self.prepared_sweep().projection
        return projection(self.spec, 1, prices_of(self.config.backend))

    def prepared_pipeline(self) -> PreparedPipeline:
        """A pipeline's every check made (its steps composed from the same project)."""
        from paiexp.pipeline.prepare import prepare_pipeline

        assert self.project is not None, "a pipeline is composed from a project"
        return prepare_pipeline(self.project, self.overrides, self.cfg)


@user_errors
def from_project(
    *overrides: str,
    project: str | os.PathLike[str] = ".",
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    config_name: str = "config",
) -> Composed:
    """A project's config composed with Hydra ``overrides``, exactly as ``python -m paiexp
    OVERRIDES`` run in ``project`` composes it (``config_dirs``: as ``--config-dir``); the job
    (or the sweep, ``+sweep=NAME``) is validated before anything is returned."""
    composed = compose_project(overrides, Path(project), config_dirs, config_name)
    _validate(composed)
    return composed


def compose_project(
    overrides: Sequence[str],
    project: Path,
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    config_name: str = "config",
) -> Composed:
    """:func:`from_project`'s composition, its checks left to the caller (a launch makes
    them once, as it prepares what it launches)."""
    from paiexp.config.compose import compose as compose_config
    from paiexp.config.compose import locate_project

    located = locate_project(
        str(project.absolute() / "conf"),
        config_name,
        [str(Path(d).absolute()) for d in config_dirs],
    )
    cfg = _tracked_in(compose_config(located, overrides), located.base_dir)
    return composed_from(located, cfg, overrides)


def composed_from(project: Project, cfg: DictConfig, overrides: Sequence[str]) -> Composed:
    """A config composed from ``project`` (the command line's, whose tracker is the working
    directory's; or :func:`compose_project`'s)."""
    return Composed(cfg, project.base_dir, tuple(overrides), project)


@user_errors
def job(
    *,
    command: str,
    name: str = "job",
    source_dir: str | None = None,
    image: str | None = None,
    instance_type: str | None = None,
    instance_count: int = 1,
    job_type: str | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    inputs: Mapping[str, str] | None = None,
    outputs: Mapping[str, str | None] | None = None,
    environments: Mapping[str, str] | None = None,
    requirements: Sequence[str] = (),
    max_run_time: int | None = None,
    metric_definitions: Sequence[Mapping[str, str]] = (),
    tensorboard: Mapping[str, Any] | None = None,
    mlflow_metrics: Sequence[str] = (),
    output_parameters: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    checkpoints: str | None = None,
    backend: str | Mapping[str, Any] = "local",
    tracker: Mapping[str, Any] | None = None,
    project: str | os.PathLike[str] = ".",
    **unknown: Any,
) -> Composed:
    """A job from keyword arguments alone, no ``conf/`` needed: the same schema and checks as
    a ``conf/job/*.yaml`` file (relative paths are ``project``'s); ``tensorboard``:
    ``{metrics: [...], other_scalars: bool}``.  ``backend``: a backend's
    name, or its settings with ``name``; ``tracker``: ``{uri, experiment, ...}``."""
    if unknown:
        from paiexp.config.schema import JobConfig

        known = ", ".join(JobConfig.__dataclass_fields__)
        raise UserError(f"job.{next(iter(unknown))}: unknown key; a job has {known}")
    definitions = _listed("job.metric_definitions", metric_definitions)
    values: dict[str, Any] = {
        "name": name,
        "command": command,
        "source_dir": source_dir,
        "image": image,
        "instance_type": instance_type,
        "instance_count": instance_count,
        "job_type": job_type,
        "hyperparameters": _mapped("job.hyperparameters", hyperparameters),
        "inputs": _mapped("job.inputs", inputs),
        "outputs": _mapped("job.outputs", outputs),
        "environments": _mapped("job.environments", environments),
        "requirements": _listed("job.requirements", requirements),
        "max_run_time": max_run_time,
        "metric_definitions": [
            _mapped(f"job.metric_definitions[{index}]", definition)
            for index, definition in enumerate(definitions)
        ],
        "tensorboard": _mapped("job.tensorboard", tensorboard),
        "mlflow_metrics": _listed("job.mlflow_metrics", mlflow_metrics),
        "output_parameters": _listed("job.output_parameters", output_parameters),
        "labels": _mapped("job.labels", labels),
        "checkpoints": checkpoints,
    }
    settings = {"name": backend} if isinstance(backend, str) else _mapped("backend", backend)
    base_dir = _project_dir(project)
    cfg = _tracked_in(_structured(values, settings, _mapped("tracker", tracker)), base_dir)
    composed = Composed(cfg, base_dir)
    _validate(composed)
    return composed


def _mapped(key: str, value: object) -> dict[Any, Any]:
    """A keyword's mapping (None: an empty one) as a dict; else a UserError naming ``key``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UserError(f"{key}: expected a mapping (a dict), got {_described(value)}")
    return dict(value)


def _listed(key: str, value: object) -> list[Any]:
    """A keyword's sequence (None: an empty one) as a list; else a UserError naming ``key``
    (a string is no sequence of strings here)."""
    if value is None:
        return []
    if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise UserError(f"{key}: expected a list, got {_described(value)}")
    return list(value)


def _project_dir(project: object) -> Path:
    """``project`` as the absolute directory it names; else a UserError."""
    if not isinstance(project, str | os.PathLike) or not isinstance(os.fspath(project), str):
        raise UserError(f"project: expected a directory's path, got {_described(project)}")
    path = Path(os.fspath(project)).absolute()
    try:
        found = path.is_dir()
    except (OSError, ValueError):  # a name too long, a NUL character: no path at all
        found = False
    if not found:
        raise UserError(f"project: {str(path)!r} is not a directory")
    return path


def _described(value: object) -> str:
    """A value in a message: its type and the start of its repr."""
    shown = repr(value)
    return f"{type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"


def _structured(
    job_values: dict[str, Any], backend: dict[str, Any], tracker: dict[str, Any]
) -> DictConfig:
    """The root config of the schema, checked as Hydra checks a composed one."""
    from omegaconf import DictConfig, OmegaConf

    from paiexp.config.compose import describe_error
    from paiexp.config.schema import BACKENDS, Config, JobConfig, TrackerConfig

    name = backend.get("name", "local")
    if not isinstance(name, str) or name not in BACKENDS:
        raise UserError(
            f"backend.name: invalid value {name!r}; expected one of {', '.join(BACKENDS)}"
        )
    try:
        root = OmegaConf.structured(
            Config(
                job=JobConfig(name="job", command="true"),
                backend=BACKENDS[name].schema(),
                tracker=TrackerConfig(),
            )
        )
        merged = OmegaConf.merge(root, {"job": job_values, "backend": backend, "tracker": tracker})
    except Exception as exc:  # OmegaConf's validation errors: one line naming the key
        raise UserError(describe_error(exc)) from None
    assert isinstance(merged, DictConfig)
    return merged


@contextlib.contextmanager
def working_in(directory: Path) -> Iterator[None]:
    """The working directory ``directory`` meanwhile: where the command line would run."""
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous)


def _tracked_in(cfg: DictConfig, base_dir: Path) -> DictConfig:
    """``cfg`` whose default tracking store is the project's ``mlflow.db``, as when the
    command line runs in the project's directory (this process may run anywhere)."""
    from paiexp.tracking.mlflow_tracker import tracking_uri

    cfg.tracker.uri = tracking_uri(cfg.tracker.uri, base_dir)
    return cfg


def _validate(composed: Composed) -> None:
    """Every check the command line makes before it submits or tracks anything, made where
    it would run (a relative ``sqlite:///`` tracking store is the project's)."""
    with working_in(composed.base_dir):
        if composed.kind == "job":
            composed.prepared()
        elif composed.kind == "sweep":
            composed.prepared_sweep()
        else:
            composed.prepared_pipeline()


@user_errors
def run(composed: Composed, *, wait: bool = True, echo: bool = False) -> Job:
    """Run a composed job: tracked in MLflow exactly as ``python -m paiexp`` tracks it (the
    command line runs its jobs through here).  ``wait=False`` returns once the job is
    submitted; it is followed (its metrics logged, its run closed) in the background, and
    :meth:`Job.wait` waits for it.  ``echo``: print the job's log as it comes."""
    if composed.kind != "job":
        instead = f"paiexp.start_{composed.kind}()"
        raise UserError(f"run: this config is a {composed.kind}; run it with {instead}")
    return run_prepared(composed.prepared(), wait=wait, echo=echo)


def run_prepared(
    prepared: PreparedJob,
    *,
    wait: bool = True,
    echo: bool = False,
    extra_tags: dict[str, str] | None = None,
) -> Job:
    """Track, submit and follow a validated job.  Waiting, it is followed in this thread
    (a first Ctrl-C stops the job, a second leaves it running: see :func:`paiexp.runs.follow`);
    else in a thread of its own."""
    from paiexp.runs import follow, open_tracker, submit
    from paiexp.tracking.cost import prices_of

    with working_in(prepared.base_dir):  # MLflow's local artifacts: the project's mlruns/
        tracker = open_tracker(prepared.config)
        run_id, handle = submit(prepared, tracker, extra_tags=extra_tags)
    job = Job(prepared.spec.name, run_id, prepared.base_dir, prepared.backend, handle, tracker)

    def following() -> None:
        job.result = follow(
            prepared.backend,
            handle,
            prepared.spec,
            tracker,
            run_id,
            prepared.base_dir,
            echo=print if echo else None,
            prices=prices_of(prepared.config.backend),
            direct=bool(prepared.config.tracker.job_uri),
        )

    if wait:
        following()
    else:
        job.follower = threading.Thread(target=following, name=f"paiexp-{handle.name}")
        job.follower.daemon = True
        job.follower.start()
    return job


@user_errors
def attach_job(name_or_run_id: str, *, tracker_uri: str | None = None, wait: bool = False) -> Job:
    """The handle of a job started anywhere (by name, or by its MLflow run's id), found
    through its run as ``paiexp attach`` finds it: re-attached, never submitted again.  A
    job still running is followed (its run closed when it ends) in the background."""
    from paiexp.backends import create_backend
    from paiexp.runs import follow_again, stored_config
    from paiexp.tracking.mlflow_tracker import TERMINAL_RUN_STATUSES

    tracker = reader(tracker_uri)
    tracked = tracker.get_run(name_or_run_id) if _is_run_id(name_or_run_id) else None
    tracked = tracked or tracker.find_run(name_or_run_id)
    if tracked is None or "paiexp.job_name" not in tracked.tags:
        raise UserError(f"attach: no MLflow run in {tracker.uri} tracks a job {name_or_run_id!r}")
    name = tracked.tags["paiexp.job_name"]
    base_dir = Path(tracked.tags["paiexp.project_dir"])
    stored = stored_config(tracker, tracked.run_id)
    backend = create_backend(stored.backend, base_dir)
    handle = backend.find(name)
    if handle is None:
        raise UserError(f"attach: backend={backend.name} has no job named {name!r}")
    attached = Job(name, tracked.run_id, base_dir, backend, handle, tracker)
    if tracked.status not in TERMINAL_RUN_STATUSES:

        def following() -> None:
            attached.result = follow_again(tracker, tracked, backend, handle, stored, echo=None)

        attached.follower = threading.Thread(target=following, daemon=True)
        attached.follower.start()
    if wait:
        attached.wait()
    return attached


def reader(tracker_uri: str | None, base_dir: Path | None = None) -> MlflowTracker:
    """A tracker that reads runs and creates nothing: no experiment, and no new ``mlflow.db``
    where a local store does not exist."""
    from paiexp.commands.download import sqlite_file
    from paiexp.tracking.mlflow_tracker import MlflowTracker, tracking_uri

    uri = tracking_uri(tracker_uri, base_dir)
    database = sqlite_file(uri)
    if database is not None and not database.is_file():
        raise UserError(f"tracker.uri: no MLflow store at {uri}; nothing has been tracked there")
    return MlflowTracker(uri, None)


def _is_run_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


@dataclass
class Job:
    """A job on its backend and its MLflow run."""

    name: str
    run_id: str
    base_dir: Path
    backend: Backend = field(repr=False)
    handle: JobHandle = field(repr=False)
    tracker: MlflowTracker = field(repr=False)
    follower: threading.Thread | None = field(default=None, repr=False)
    result: JobResult | None = field(default=None, repr=False)

    @property
    def status(self) -> str:
        """SUBMITTED, PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED, as the backend says."""
        return self.backend.poll([self.handle])[self.handle.id].state.value

    def wait(self, timeout: float | None = None) -> Job:
        """Until the job ended and its run is closed; TimeoutError after ``timeout`` s."""
        if self.follower is not None:
            self.follower.join(timeout)
            if self.follower.is_alive():
                raise TimeoutError(f"job {self.name} still {self.status} after {timeout} s")
        return self

    def stop(self) -> None:
        """Stop the job (as a first Ctrl-C does: its run ends KILLED)."""
        self.backend.stop(self.handle)

    def log(self) -> str:
        """The job's log so far."""
        return "\n".join(self.log_lines())

    def log_lines(self) -> Iterator[str]:
        """The job's log lines so far, in order."""
        cursor = 0
        while True:
            chunk = self.backend.read_logs(self.handle, cursor, final=True)
            if not chunk.lines or chunk.cursor == cursor:
                return
            yield from chunk.lines
            cursor = chunk.cursor

    def stream(self, poll_interval: float | None = None) -> Iterator[str]:
        """The job's log lines as they come, from its start until it ends."""
        cursor = 0
        while True:
            status = self.backend.poll([self.handle])[self.handle.id]
            ended = status.state.terminal
            chunk = self.backend.read_logs(self.handle, cursor, final=ended)
            yield from chunk.lines
            cursor = chunk.cursor
            if ended:
                return
            self.backend.wait([self.handle], poll_interval or self.backend.poll_interval)

    @property
    def metrics(self) -> dict[str, float]:
        """Each metric's final value, as its run holds it."""
        return self.tracker.final_metrics(self.run_id)

    def metric_series(self, name: str) -> list[tuple[int, float]]:
        """A metric's (step, value) points."""
        return self.tracker.metric_series(self.run_id, name)

    @property
    def output_parameters(self) -> dict[str, float]:
        return self.backend.output_parameters(self.handle)

    @property
    def outputs(self) -> dict[str, str]:
        """Output channel -> URI."""
        return self.backend.outputs(self.handle)

    @property
    def model_uri(self) -> str | None:
        return self.outputs.get("model")

    def download(self, dest: str | os.PathLike[str], *, channel: str = "model") -> list[Path]:
        """An output channel's files (the model by default) into ``dest``."""
        return _download(self, channel, Path(dest))

    @property
    def ui_url(self) -> str:
        """The run's page in the MLflow UI (a tracking server's, or ``mlflow ui``'s)."""
        from paiexp.tracking.browse import run_url, ui_address

        _, base = ui_address(self.tracker.uri)
        tracked = self.tracker.get_run(self.run_id)
        assert tracked is not None
        return run_url(base, tracked.experiment_id, self.run_id)


@user_errors
def _download(job: Job, channel: str, dest: Path) -> list[Path]:
    from paiexp.commands.download import download
    from paiexp.runs import stored_config

    uri = job.outputs.get(channel)
    if uri is None:
        raise UserError(f"channel: job {job.name} has no output channel {channel!r}")
    stored = stored_config(job.tracker, job.run_id)
    return download(uri, dest, stored.backend)
