"""``hydra/launcher=paiexp``: each job of a Hydra multirun as a paiexp job on any backend.

Per job: its config composed here as Hydra's basic launcher composes it, a paiexp job whose
code is a snapshot of the app's and whose command runs :mod:`paiexp.hydra_launch.job_runner`
(the app again with the job's overrides, or a task function shipped by value), tracked as an
MLflow run under one parent run for the multirun, and Hydra's :class:`JobReturn` made here
from what the job wrote into its ``hydra`` output channel (its output directory fetched back
from a remote backend).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from packaging.version import Version

from paiexp.config.schema import TrackerConfig
from paiexp.errors import ConfigError, UserError
from paiexp.hydra_launch import job_runner
from paiexp.hydra_launch.app import AppEntry, app_entry, snapshot_code, source_dir
from paiexp.hydra_launch.settings import LauncherJobConfig, PaiexpLauncherConf, backend_name
from paiexp.tracking.monitor import NO_MODEL_LABEL

if TYPE_CHECKING:
    from hydra.types import HydraContext

    from paiexp.api.jobs import Composed, Job
    from paiexp.runs import PreparedJob
    from paiexp.tracking.mlflow_tracker import MlflowTracker

log = logging.getLogger(__name__)

CHANNEL = "hydra"  # the job's input (runner, job files) and output (result, workdir) channel
STATE_DIR = ".paiexp"  # in the sweep directory: the code snapshot and each job's channel
JOB_FILE = "job.json"
PAYLOAD_FILE = "task.pkl"
RUNNER_FILE = "job_runner.py"
MULTIRUN_KIND = "multirun"
NUM_TAG = "paiexp.hydra.job_num"
# Hydra's own overrides that a job's re-run must not get: the multirun's launcher, sweeper
# and directories are the launcher's business (the job gets its own output directory).
NOT_RERUN = re.compile(r"^[+~]*hydra(/launcher|/sweeper|\.launcher|\.sweeper|\.sweep\.|\.mode)")


class RemoteTaskError(Exception):
    """A job's task failed where it ran and its exception did not come back as itself."""


class LauncherConfigError(ConfigError, CompactHydraException):
    """Bad ``hydra.launcher.*`` input: Hydra prints it as its one line, no traceback, and
    nothing was submitted."""


def launcher_keyed(message: str) -> str:
    """A paiexp job's refusal, its key named as the launcher's (``hydra.launcher.job.X``)."""
    if message.startswith(("job.", "backend", "tracker.")):
        message = f"hydra.launcher.{message}"
    return f"paiexp: error: {message}"


@dataclass
class PendingJob:
    """One job of a batch, every check made: its paiexp job and its JobReturn to fill."""

    num: int
    ret: JobReturn
    output_dir: Path
    prepared: PreparedJob


class MultirunLauncher:
    """The paiexp launcher's work; :class:`PaiexpLauncher` is Hydra's face of it."""

    def __init__(
        self,
        hydra_context: HydraContext,
        task_function: Callable[[DictConfig], Any],
        config: DictConfig,
    ) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.config = config
        self.cwd = Path.cwd()
        self.token = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        schema = OmegaConf.structured(PaiexpLauncherConf)
        merged = OmegaConf.merge(schema, config.hydra.launcher)
        self.settings: PaiexpLauncherConf = OmegaConf.to_object(merged)  # type: ignore[assignment]
        self.parent_run_id: str | None = None
        self._started: list[Job] = []
        self._stopping = False
        self._lock = threading.Lock()
        # MLflow takes seconds to import: imported meanwhile, while jobs are composed and checked
        self._importing_pool = ThreadPoolExecutor(1, thread_name_prefix="paiexp-import")
        self._importing = self._importing_pool.submit(importlib.import_module, "mlflow.tracking")

    @property
    def backend_name(self) -> str:
        return backend_name(self.settings.backend)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        try:
            return self._launch(job_overrides, initial_job_idx)
        except UserError as exc:
            raise LauncherConfigError(launcher_keyed(str(exc))) from None

    def _launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        state = sweep_dir / STATE_DIR / self.token  # another multirun may share the directory
        made = new_directories(state)
        try:
            entry, pending = self._prepare(job_overrides, initial_job_idx, state)
        except UserError:
            remove_directories(made)  # refused before anything ran: nothing of it is left
            raise
        log.info(f"Launching {len(pending)} jobs on backend={self.backend_name}")
        for job, overrides in zip(pending, job_overrides, strict=True):
            log.info(f"\t#{job.num} : {' '.join(filter_overrides(overrides))}")
        self._importing.result()
        self._importing_pool.shutdown()
        tracker = self._open_tracker()
        parent = self._parent_run(tracker, sweep_dir, entry)
        pool = ThreadPoolExecutor(min(len(pending), self._parallelism()), "paiexp-hydra")
        try:
            returns = list(pool.map(lambda each: self._run(each, tracker, parent), pending))
        except KeyboardInterrupt:  # Ctrl-C: every job of the batch stopped, none submitted
            with self._lock:
                self._stopping = True
                started = list(self._started)
            for submitted in started:
                submitted.stop()
            tracker.terminate(parent, "KILLED")
            raise
        finally:
            pool.shutdown(cancel_futures=True)  # its runs closed as their jobs end
        failed = any(ret.status != JobStatus.COMPLETED for ret in returns)
        tracker.terminate(parent, "FAILED" if failed else "FINISHED")
        return returns

    # -- preparing ---------------------------------------------------------------------------

    def _prepare(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, state: Path
    ) -> tuple[AppEntry | None, list[PendingJob]]:
        """Every job of a batch composed and checked, before any is submitted."""
        state.mkdir(parents=True, exist_ok=True)
        code = source_dir(self.cwd, self.settings.job.source_dir)
        entry = app_entry(self.task_function, code)
        snapshot = snapshot_code(code, state / "code")
        channels = state / "jobs"  # one input channel each: a backend uploads only its own
        channels.mkdir(exist_ok=True)
        template = self._job_template(snapshot, channels)
        pending = [
            self._pending(initial_job_idx + index, overrides, entry, channels, template)
            for index, overrides in enumerate(job_overrides)
        ]
        return entry, pending

    def _job_template(self, snapshot: Path, channel: Path) -> Composed:
        """The multirun's paiexp job: every job of it differs only in its name and command."""
        return job_template(
            self.settings.job,
            self.settings.backend,
            self.settings.tracker,
            snapshot,
            channel,
            self.cwd,
        )

    def _pending(
        self,
        num: int,
        overrides: Sequence[str],
        entry: AppEntry | None,
        channels: Path,
        template: Composed,
    ) -> PendingJob:
        from paiexp.runs import prepare_config

        channel = channels / str(num)
        channel.mkdir(exist_ok=True)
        shutil.copy2(job_runner.__file__, channel / RUNNER_FILE)
        sweep_config = self.hydra_context.config_loader.load_sweep_config(
            self.config, list(overrides)
        )
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = num
            sweep_config.hydra.job.num = num
        ret, output_dir = job_return(sweep_config)
        local = self.backend_name == "local"
        description: dict[str, Any] = {
            "num": num,
            "id": str(num),
            "run_dir": str(output_dir) if local else None,
            "cwd": str(self.cwd) if local else None,
        }
        if entry is None:
            _write_payload(
                channel / PAYLOAD_FILE,
                (
                    self.task_function,
                    _portable(sweep_config),
                    _job_context(self.hydra_context),
                    _job_state(),
                ),
            )
            description.update(mode="function", payload=PAYLOAD_FILE)
        else:
            description.update(
                mode="app",
                entry=entry.as_json(),
                overrides=list(ret.overrides or ()),
                hydra_overrides=rerun_hydra_overrides(self.config),
                stubs=stubs(),
            )
        (channel / JOB_FILE).write_text(json.dumps(description), encoding="utf-8")
        cfg = copy.deepcopy(template.cfg)
        cfg.job.inputs[CHANNEL] = str(channel)
        cfg.job.name = self._job_name(num, ret.task_name or "app")
        cfg.job.command = runner_command(self.settings.job.python)
        prepared = prepare_config(cfg, template.base_dir, tuple(ret.overrides or ()))
        return PendingJob(num, ret, output_dir, prepared)

    def _job_name(self, num: int, task_name: str) -> str:
        base = self.settings.job.name or task_name
        slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "app"
        if not slug[0].isalpha():
            slug = f"a{slug}"
        return f"{slug[:12].rstrip('-')}-{num}"

    def _parallelism(self) -> int:
        if self.settings.parallelism is not None:
            return max(1, self.settings.parallelism)
        if self.backend_name == "local":
            return os.cpu_count() or 1
        return 1 << 16  # the platform queues what its quota cannot run yet

    # -- tracking ----------------------------------------------------------------------------

    def _open_tracker(self) -> MlflowTracker:
        from paiexp.tracking.mlflow_tracker import MlflowTracker, tracking_uri

        tracker = self.settings.tracker
        return MlflowTracker(tracking_uri(tracker.uri, self.cwd), tracker.experiment)

    def _parent_run(self, tracker: MlflowTracker, sweep_dir: Path, entry: AppEntry | None) -> str:
        """The multirun's parent run: made at its first batch, RUNNING again at each next."""
        from paiexp.tracking.mlflow_tracker import KIND_TAG

        if self.parent_run_id is None:
            app = entry.describe() if entry else getattr(self.task_function, "__qualname__", "")
            self.parent_run_id = tracker.create_tagged_run(
                f"{self.config.hydra.job.name}-multirun",
                {
                    KIND_TAG: MULTIRUN_KIND,
                    "paiexp.hydra.app": app,
                    "paiexp.hydra.sweep_dir": str(sweep_dir),
                    "paiexp.overrides": " ".join(self.config.hydra.overrides.task),
                    "paiexp.project_dir": str(self.cwd),
                },
            )
        else:
            tracker.set_status(self.parent_run_id, "RUNNING")
        return self.parent_run_id

    # -- running -----------------------------------------------------------------------------

    def _run(self, pending: PendingJob, tracker: MlflowTracker, parent: str) -> JobReturn:
        from paiexp.api.jobs import run_prepared
        from paiexp.tracking.mlflow_tracker import PARENT_RUN_TAG

        job = run_prepared(
            pending.prepared,
            wait=False,
            extra_tags={PARENT_RUN_TAG: parent, NUM_TAG: str(pending.num)},
        )
        with self._lock:
            self._started.append(job)
            stopping = self._stopping
        if stopping:  # submitted as Ctrl-C stopped the others
            job.stop()
        assert isinstance(pending.ret.cfg, DictConfig)
        tracker.log_params(job.run_id, _app_params(pending.ret.cfg))
        job.wait()
        ret = pending.ret
        outcome = self._fetch(job, pending)
        if outcome is None:
            ret.status = JobStatus.FAILED
            ret.return_value = RemoteTaskError(_ended(job))
        elif outcome["status"] == "COMPLETED":
            ret.status = JobStatus.COMPLETED
            ret.return_value = _loaded(outcome, "value")
        else:
            ret.status = JobStatus.FAILED
            ret.return_value = _exception(outcome, job)
        if outcome and outcome.get("task_name"):
            ret.task_name = outcome["task_name"]
        return ret

    def _fetch(self, job: Job, pending: PendingJob) -> dict[str, Any] | None:
        """The job's outcome from its ``hydra`` channel (None: it wrote none), its output
        directory brought here when it ran elsewhere."""
        from paiexp.commands.download import download

        uri = job.outputs.get(CHANNEL)
        if uri is None:
            return None
        with tempfile.TemporaryDirectory(prefix="paiexp-hydra-") as scratch:
            fetched = Path(scratch)
            download(uri, fetched, pending.prepared.config.backend)
            workdir = fetched / job_runner.WORKDIR
            if workdir.is_dir():
                shutil.copytree(workdir, pending.output_dir, dirs_exist_ok=True)
            result = fetched / job_runner.RESULT_FILE
            if not result.is_file():
                return None
            outcome: dict[str, Any] = pickle.loads(result.read_bytes())
            return outcome


def job_return(config: DictConfig) -> tuple[JobReturn, Path]:
    """A job's :class:`JobReturn` as Hydra's ``run_job`` fills it before the task runs, and
    its output directory (``config``'s runtime output directory is set to it)."""
    from hydra import version

    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    hydra_config.set_config(config)
    try:
        output_dir = Path(
            str(OmegaConf.select(config, "hydra.sweep.dir")),
            str(OmegaConf.select(config, "hydra.sweep.subdir")),
        ).absolute()
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = str(output_dir)
        hydra_config.set_config(config)
        ret = JobReturn()
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        ret.cfg = task_cfg
        ret.hydra_cfg = copy.deepcopy(hydra_config.cfg)  # type: ignore[assignment]
        overrides = OmegaConf.to_container(config.hydra.overrides.task)
        assert isinstance(overrides, list)
        ret.overrides = [str(item) for item in overrides]
        chdir = config.hydra.job.chdir
        if chdir is None:
            chdir = not version.base_at_least("1.2")
        ret.working_dir = str(output_dir) if chdir else os.getcwd()
        ret.task_name = str(config.hydra.job.name)
        return ret, output_dir
    finally:
        hydra_config.cfg = previous


def new_directories(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    return [each for each in (path, *path.parents) if not each.exists()]


def remove_directories(made: list[Path]) -> None:
    """Remove what :func:`new_directories` listed (the first with what it holds), as far up
    as they are empty: another run may have put something in one meanwhile."""
    if made:
        shutil.rmtree(made[0], ignore_errors=True)
    for directory in made[1:]:
        with contextlib.suppress(OSError):
            directory.rmdir()


def job_template(
    settings: LauncherJobConfig,
    backend: Any,
    tracker: TrackerConfig,
    snapshot: Path,
    channel: Path,
    project: Path,
    *,
    command: str = "true",
    metric_definitions: Sequence[dict[str, str]] = (),
) -> Composed:
    """The paiexp job each job (or trial) is, checked as ``paiexp.job(...)`` checks one: the
    app's code snapshot, the launcher's ``hydra`` channels and ``hydra.launcher.job``'s (or
    ``hydra.sweeper.job``'s) fields."""
    from paiexp.api.jobs import job

    inputs = dict(settings.inputs)
    outputs = dict(settings.outputs)
    for reserved, given in ((inputs, "inputs"), (outputs, "outputs")):
        if CHANNEL in reserved:
            raise UserError(
                f"job.{given}.{CHANNEL}: the channel is the launcher's own; name yours otherwise"
            )
    return job(
        command=command,
        name="hydra",
        source_dir=str(snapshot),
        image=settings.image,
        instance_type=settings.instance_type,
        instance_count=settings.instance_count,
        job_type=settings.job_type.value if settings.job_type else None,
        inputs={**inputs, CHANNEL: str(channel)},
        outputs={**outputs, CHANNEL: None},
        environments=settings.environments,
        requirements=settings.requirements,
        max_run_time=settings.max_run_time,
        metric_definitions=[*(vars(d) for d in settings.metric_definitions), *metric_definitions],
        tensorboard=vars(settings.tensorboard),
        mlflow_metrics=list(settings.mlflow_metrics),
        labels={**settings.labels, NO_MODEL_LABEL[0]: NO_MODEL_LABEL[1]},
        checkpoints=settings.checkpoints,
        backend=backend,
        tracker=vars(tracker),
        project=project,
    )


def runner_command(python: str) -> str:
    """The command of a job that runs ``job_runner.py`` from its ``hydra`` input channel."""
    return f'{python} "$PAI_INPUT_HYDRA/{RUNNER_FILE}" "$PAI_INPUT_HYDRA/{JOB_FILE}"'


def rerun_hydra_overrides(config: DictConfig) -> list[str]:
    """The command line's Hydra overrides that a job's re-run of the app gets."""
    given = OmegaConf.to_container(config.hydra.overrides.hydra)
    assert isinstance(given, list)
    return [str(item) for item in given if not NOT_RERUN.match(str(item))]


def _portable(config: DictConfig) -> DictConfig:
    """A job's config that unpickles where paiexp is not installed: its ``hydra.launcher``
    node plain (its schema, paiexp's own class, would be looked up there)."""
    config = copy.deepcopy(config)
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.launcher = OmegaConf.create(OmegaConf.to_container(config.hydra.launcher))
    return config


def _job_context(hydra_context: HydraContext) -> HydraContext:
    """What ``run_job`` needs of Hydra's context where the job runs: the callbacks (the config
    loader, with its cache of composed nodes of paiexp's schema, composes nothing there)."""
    from hydra.types import HydraContext

    return HydraContext(config_loader=None, callbacks=hydra_context.callbacks)  # type: ignore[arg-type]


def _job_state() -> Any:
    """Hydra's state for a job shipped by value (its resolvers, its job's runtime), without
    what it does not need and that names paiexp's classes: the config store and Hydra itself
    (composition is done here), the multirun's Hydra config (the job's own is set as it
    runs); the version base as text (a ``packaging`` Version pickles by its version)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.singleton import Singleton
    from hydra.version import VersionBase, getbase

    state = Singleton.get_state()
    for unneeded in (ConfigStore, GlobalHydra, HydraConfig, VersionBase):
        state["instances"].pop(unneeded, None)
    base = getbase()
    state["paiexp_version_base"] = str(base) if isinstance(base, Version) else None
    return state


def _write_payload(path: Path, payload: object) -> None:
    """The task function and its job's config, pickled by value where they must be."""
    import cloudpickle

    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(cloudpickle.dumps(payload))
    partial.replace(path)


def stubs() -> dict[str, dict[str, Any]]:
    """Config nodes, by group and name, for an app whose defaults select paiexp's launcher or
    sweeper (and a sampler, as hydra-optuna-sweeper's apps do): plain, no paiexp class."""
    from paiexp.hydra_launch.settings import SAMPLER_CONFS, PaiexpSweeperConf

    def plain(node: Any) -> dict[str, Any]:
        tree = OmegaConf.to_container(OmegaConf.structured(node), enum_to_str=True)
        assert isinstance(tree, dict)
        return {str(key): value for key, value in tree.items()}

    return {
        "hydra/launcher": {"paiexp": plain(PaiexpLauncherConf)},
        "hydra/sweeper": {"paiexp": plain(PaiexpSweeperConf)},
        "hydra/sweeper/sampler": {name: plain(conf) for name, conf in SAMPLER_CONFS.items()},
    }


def _app_params(cfg: DictConfig) -> dict[str, str]:
    """The app's config as MLflow params, flat (``db.user``), resolved where it resolves."""
    from paiexp.contract.layout import flatten_hyperparameters

    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # an interpolation only the job resolves: shown as written
        tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)
    flat = flatten_hyperparameters({str(key): value for key, value in tree.items()})
    return {
        key: value if isinstance(value, str) else json.dumps(value) for key, value in flat.items()
    }


def _loaded(outcome: dict[str, Any], key: str) -> Any:
    """A value the job pickled, or its repr where it does not unpickle here."""
    if key in outcome:
        try:
            return pickle.loads(outcome[key])
        except Exception:
            log.warning(f"the job's {key} does not unpickle here; its repr stands for it")
    return outcome.get(f"{key}_repr")


def _exception(outcome: dict[str, Any], job: Job) -> BaseException:
    """The task's exception as itself, else a :class:`RemoteTaskError` of its type, message
    and traceback (or of how the app failed before its task, and the job's log)."""
    if "what" in outcome:
        return RemoteTaskError(f"{outcome['what']}; {_ended(job)}")
    exception = _loaded(outcome, "exception") if "exception" in outcome else None
    if isinstance(exception, BaseException):
        return exception
    return RemoteTaskError(
        f"{outcome['type']}: {outcome['message']}\n{outcome.get('traceback', '')}".rstrip()
    )


def _ended(job: Job) -> str:
    """How a job that left no outcome ended, with its log's last lines."""
    result = job.result
    state = result.status.state.value if result else "ended"
    reason = f" ({result.status.reason})" if result and result.status.reason else ""
    tail = "\n".join(result.log_tail) if result and result.log_tail else ""
    return f"job {job.name} {state}{reason} without the task's outcome" + (
        f"; its log ends:\n{tail}" if tail else ""
    )
