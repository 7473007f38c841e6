"""``hydra/sweeper=paiexp``: a Hydra app's sweep, configured as for hydra-optuna-sweeper, run by
paiexp's sweep launcher (asynchronous slots, pruning, crash-safe resume, shared studies, MLflow,
any backend).

Each trial is a paiexp job that runs the app again (:mod:`paiexp.hydra_launch.job_runner`) with
the sweep's fixed overrides and the trial's point as ``name=value`` overrides; the task's return
value comes back as log lines, read as the objective(s) ``return_value`` (``return_value_N``
for several directions), or the objective is a metric the job reports.  At the end, the best
point is written to ``optimization_results.yaml`` in the sweep directory, as that sweeper does.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import configure_log, setup_globals
from hydra.errors import CompactHydraException, HydraException
from omegaconf import DictConfig, OmegaConf

from paiexp.errors import UserError
from paiexp.hydra_launch import job_runner
from paiexp.hydra_launch.app import app_entry, snapshot_code, source_dir
from paiexp.hydra_launch.launcher import (
    CHANNEL,
    JOB_FILE,
    RUNNER_FILE,
    STATE_DIR,
    LauncherConfigError,
    job_template,
    new_directories,
    remove_directories,
    rerun_hydra_overrides,
    runner_command,
    stubs,
)
from paiexp.hydra_launch.settings import SAMPLER_CONFS, PaiexpSweeperConf, backend_name

if TYPE_CHECKING:
    from optuna import Trial

    from paiexp.sweep.prepared import PreparedSweep, SweepOutcome

log = logging.getLogger(__name__)

RETURN_VALUE = "return_value"
RESULTS_FILE = "optimization_results.yaml"
# hydra-optuna-sweeper's sampler classes -> paiexp's sampler names (MOTPE is TPE since Optuna 3;
# a grid is every point of a discrete space)
SAMPLER_NAMES = {
    "TPESampler": "tpe",
    "MOTPESampler": "tpe",
    "RandomSampler": "random",
    "CmaEsSampler": "cmaes",
    "NSGAIISampler": "nsgaii",
    "NSGAIIISampler": "nsgaiii",
    "QMCSampler": "qmc",
    "GPSampler": "gp",
    "GridSampler": "bruteforce",
    "BruteForceSampler": "bruteforce",
}
# paiexp's keys in its refusals -> this sweeper's
KEYS = (
    ("sweep.params.", "hydra.sweeper.params."),
    ("sweep.parallelism", "hydra.sweeper.n_jobs"),
    ("sweep.sampler.options", "hydra.sweeper.sampler"),
    ("sweep.", "hydra.sweeper."),
    ("job.", "hydra.sweeper.job."),
    ("backend", "hydra.sweeper.backend"),
    ("tracker.", "hydra.sweeper.tracker."),
)


class SweepFailed(CompactHydraException):
    """The sweep ended without a completed trial, or stopped on its failures."""


def sweeper_keyed(message: str) -> str:
    """A paiexp refusal, its key named as this sweeper's (``hydra.sweeper.X``)."""
    for ours, theirs in KEYS:
        if message.startswith(ours):
            message = theirs + message[len(ours) :]
            break
    return f"paiexp: error: {message}"


@dataclasses.dataclass(frozen=True)
class Space:
    """The sweep's parameters: searched ones in paiexp's grammar (by the app's key) and fixed
    overrides every trial gets."""

    searched: dict[str, Any]
    fixed: list[str]


class AppSweep:
    """The paiexp sweeper's work; :class:`PaiexpSweeper` is Hydra's face of it."""

    def __init__(self, task_function: Callable[[DictConfig], Any], config: DictConfig) -> None:
        self.task_function = task_function
        self.config = config
        self.cwd = Path.cwd()
        merged = OmegaConf.merge(OmegaConf.structured(PaiexpSweeperConf), config.hydra.sweeper)
        self.settings: PaiexpSweeperConf = OmegaConf.to_object(merged)  # type: ignore[assignment]
        self.settings.sampler = OmegaConf.to_container(merged.sampler, enum_to_str=True)
        self.backend_name = backend_name(self.settings.backend)

    def sweep(self, arguments: list[str]) -> dict[str, Any]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        state = sweep_dir / STATE_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        made = new_directories(state)
        try:
            prepared = self._prepare(arguments, state, sweep_dir)
        except UserError as exc:
            remove_directories(made)  # refused before anything ran: nothing of it is left
            raise LauncherConfigError(sweeper_keyed(str(exc))) from None
        outcome = self._run(prepared)
        if self.backend_name != "local":  # on local, each trial wrote its directory here
            _fetch_trial_dirs(prepared, outcome, sweep_dir)
        results = _results(outcome, prepared)
        OmegaConf.save(OmegaConf.create(results), sweep_dir / RESULTS_FILE)
        if outcome.interrupted:
            raise SweepFailed("paiexp: the sweep was interrupted; run it again to resume it")
        if outcome.failed or not outcome.completed:
            reason = re.sub(
                r"sweep\.max_failures=\d+",
                f"hydra.sweeper.max_failure_rate={self.settings.max_failure_rate:g}",
                outcome.stop_reason or "no trial completed",
            )
            raise SweepFailed(f"paiexp: the sweep failed: {reason}")
        return results

    # -- preparing ---------------------------------------------------------------------------

    def _prepare(self, arguments: list[str], state: Path, sweep_dir: Path) -> PreparedSweep:
        """The app's sweep as a paiexp sweep, every check made, nothing submitted."""
        from paiexp.api.jobs import Composed, working_in

        settings = self.settings
        code = source_dir(self.cwd, self.settings.job.source_dir)
        entry = app_entry(self.task_function, code)
        if entry is None:
            raise UserError(
                "hydra/sweeper=paiexp runs the app again in each trial: start it from its "
                "script, with python -m, or as a console script"
            )
        space = self._space(arguments)
        objectives = self._objectives()
        state.mkdir(parents=True, exist_ok=True)
        snapshot = snapshot_code(code, state / "code")
        channel = state / "trials"  # every trial's input channel: the runner and the sweep
        channel.mkdir()
        shutil.copy2(job_runner.__file__, channel / RUNNER_FILE)
        local = self.backend_name == "local"
        returned = [o["metric"] for o in objectives if o["metric"].startswith(RETURN_VALUE)]
        description = {
            "mode": "app",
            "entry": entry.as_json(),
            "overrides": space.fixed,
            "hydra_overrides": rerun_hydra_overrides(self.config),
            "stubs": stubs(),
            "run_dir": None,
            "sweep_dir": str(sweep_dir) if local else None,
            "cwd": str(self.cwd) if local else None,
            "objectives": returned,  # none: the objective is a metric, the value any
            "searched": [_app_param(name) for name in space.searched],
        }
        (channel / JOB_FILE).write_text(json.dumps(description), encoding="utf-8")
        template = job_template(
            settings.job,
            settings.backend,
            settings.tracker,
            snapshot,
            channel,
            self.cwd,
            command=runner_command(settings.job.python),
            metric_definitions=[_returned_metric(name) for name in returned],
        )
        cfg = OmegaConf.merge(template.cfg, {"sweep": self._sweep_node(space, objectives)})
        assert isinstance(cfg, DictConfig)
        with working_in(self.cwd):
            prepared = Composed(cfg, self.cwd, tuple(arguments)).prepared_sweep()
        extend = self._extender()
        return dataclasses.replace(prepared, extend_trial=extend) if extend else prepared

    def _space(self, arguments: list[str]) -> Space:
        """``params`` (or the older ``search_space``) and the command line's overrides, the
        later of a key winning as with hydra-optuna-sweeper: a sweep searched, a value fixed."""
        settings = self.settings
        searched: dict[str, Any] = {}
        fixed: dict[str, str] = {}
        if settings.params is None and settings.search_space:
            for name, spec in settings.search_space.items():
                searched[str(name)] = _structured(str(name), spec)
        given = [
            (f"sweep.params.{name}", f"{name}={value}")
            for name, value in (settings.params or {}).items()
        ]
        parser = OverridesParser.create()
        for where, text in [*given, *((text, text) for text in arguments)]:
            try:
                override = parser.parse_override(text)
            except HydraException as exc:
                raise UserError(f"{where}: {' '.join(str(exc).split())}") from None
            key = override.get_key_element()
            searched.pop(key, None)
            fixed.pop(key, None)
            if override.is_sweep_override() and not override.is_delete():
                searched[_param_name(key, where)] = text.split("=", 1)[1]
            else:
                fixed[key] = text
        if not searched:
            raise UserError(
                "params: nothing to search; give hydra.sweeper.params "
                "(x: interval(0, 1), y: choice(a, b)) or sweep overrides on the command line"
            )
        return Space(searched, list(fixed.values()))

    def _objectives(self) -> list[dict[str, str]]:
        """``objective`` as paiexp's items: the return value's, one per direction, unless a
        metric the job reports is named."""
        settings = self.settings
        directions = _directions(settings.direction)
        if isinstance(settings.objective, str):
            return [{"metric": settings.objective, "direction": directions[0]}]
        if settings.objective is not None:  # paiexp's {metric, direction} items
            given = settings.objective
            return list(given) if isinstance(given, list) else [given]
        if len(directions) == 1:
            return [{"metric": RETURN_VALUE, "direction": directions[0]}]
        return [
            {"metric": f"{RETURN_VALUE}_{index}", "direction": direction}
            for index, direction in enumerate(directions)
        ]

    def _sweep_node(self, space: Space, objectives: list[dict[str, str]]) -> dict[str, Any]:
        settings = self.settings
        name = settings.study_name or str(self.config.hydra.job.name)
        sampler = _sampler(settings.sampler)
        n_trials = settings.n_trials
        if sampler["name"] == "bruteforce":
            n_trials = min(n_trials, _grid_size(space.searched))
        if not 0.0 <= settings.max_failure_rate <= 1.0:
            raise UserError(
                f"sweep.max_failure_rate: must be within [0, 1], got {settings.max_failure_rate}"
            )
        node: dict[str, Any] = {
            "name": _slug(name),
            "study_name": name,
            "objective": objectives,
            "params": space.searched,
            "n_trials": n_trials,
            "parallelism": settings.n_jobs,
            "sampler": sampler,
            "pruner": dataclasses.asdict(settings.pruner),
            "retries": settings.retries,
            "timeout": settings.timeout,
            # the count of failures that takes the study past the rate
            "max_failures": math.floor(settings.max_failure_rate * n_trials) + 1,
        }
        if settings.storage is not None:
            node["storage"] = settings.storage
        return node

    def _extender(self) -> Callable[[Trial], None] | None:
        """``custom_search_space``: the app's ``function(cfg, trial)``, called with this
        sweep's config as each trial's parameters are drawn."""
        path = self.settings.custom_search_space
        if not path:
            return None
        module_name, _, attribute = path.lstrip(".").rpartition(".")
        try:
            function = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UserError(
                f"sweep.custom_search_space: cannot load {path!r} (module.function, importable "
                f"from {sys.path[0] or '.'}): {exc}"
            ) from None
        config = self.config
        return lambda trial: function(config, trial)

    # -- running -----------------------------------------------------------------------------

    def _run(self, prepared: PreparedSweep) -> SweepOutcome:
        from paiexp.api.sweeps import run_shown_sweep

        log.info(
            f"Sweeping study {prepared.study_name} ({prepared.storage}) on "
            f"backend={self.backend_name}: {prepared.sweep.n_trials} trials, "
            f"{prepared.sweep.parallelism} at once"
        )
        return run_shown_sweep(prepared)


def _fetch_trial_dirs(prepared: PreparedSweep, outcome: SweepOutcome, sweep_dir: Path) -> None:
    """Each finished trial's Hydra directory (its ``.hydra/`` files, its log), brought into
    the sweep directory from the ``hydra`` output of its job."""
    from paiexp.commands.download import download
    from paiexp.sweep.records import JOB_NAME

    backend = prepared.backend
    for trial in outcome.study.get_trials(deepcopy=False):
        name = trial.user_attrs.get(JOB_NAME)
        target = sweep_dir / str(trial.number)
        if not trial.state.is_finished() or name is None or target.exists():
            continue
        handle = backend.find(str(name))
        uri = backend.outputs(handle).get(CHANNEL) if handle is not None else None
        if uri is None:
            continue
        with tempfile.TemporaryDirectory(prefix="paiexp-hydra-") as scratch:
            download(uri, Path(scratch), prepared.config.backend)
            workdir = Path(scratch, job_runner.WORKDIR)
            if workdir.is_dir():
                shutil.copytree(workdir, target)


def _directions(direction: Any) -> list[str]:
    """``direction`` as names (a name, an enum's name, or a list of them)."""
    given = direction if isinstance(direction, list) else [direction]
    names = [str(getattr(d, "name", d)) for d in given]
    for name in names:
        if name not in ("minimize", "maximize"):
            raise UserError(f"sweep.direction: invalid value {name!r}; minimize or maximize")
    return names


def _param_name(key: str, where: str) -> str:
    """The trial parameter of an app's key (paiexp's own ``job.``/``backend.`` keys spelt as
    the job's hyperparameters), refused where a job's hyperparameter could not carry it."""
    from paiexp.contract.layout import HYPERPARAMETER_NAME
    from paiexp.sweep.space import SWEPT_PREFIXES

    if not HYPERPARAMETER_NAME.match(key):
        raise UserError(
            f"{where}: a searched key must be a config key (letters, digits, "
            "'_', '.', '-'), not a group path or an addition"
        )
    return f"job.hyperparameters.{key}" if key.startswith(SWEPT_PREFIXES) else key


def _structured(name: str, spec: Any) -> dict[str, Any]:
    """A ``search_space`` entry ({type, low, high, log, step, choices}) in paiexp's form."""
    if not isinstance(spec, dict):
        raise UserError(f"search_space.{name}: expected {{type, low, high, ...}}, got {spec!r}")
    entry = {key: value for key, value in spec.items() if value is not None}
    if entry.get("log") is False:
        entry.pop("log")
    entry["type"] = str(getattr(entry.get("type"), "name", entry.get("type")))
    return entry


def _sampler(given: Any) -> dict[str, Any]:
    """hydra-optuna-sweeper's ``sampler`` node as paiexp's: its name, seed, and the options a
    user set (those at that sweeper's defaults are Optuna's own, or no longer Optuna's)."""
    if not given:
        return {"name": "tpe"}
    target = str(given.get("_target_", ""))
    class_name = target.rsplit(".", 1)[-1]
    if class_name not in SAMPLER_NAMES:
        raise UserError(
            f"sweep.sampler._target_: {target!r} is not a sampler paiexp runs; available: "
            + ", ".join(f"optuna.samplers.{name}" for name in SAMPLER_NAMES)
        )
    defaults: dict[str, Any] = {}
    for conf in SAMPLER_CONFS.values():
        if conf._target_ == target:  # type: ignore[attr-defined]
            defaults = {f.name: f.default for f in dataclasses.fields(conf)}
    options = {
        key: value
        for key, value in given.items()
        if key not in ("_target_", "_partial_", "seed")
        and (key not in defaults or value != defaults[key])
    }
    return {"name": SAMPLER_NAMES[class_name], "seed": given.get("seed"), "options": options}


def _grid_size(searched: dict[str, Any]) -> int:
    """How many points a grid of the searched parameters has."""
    from paiexp.sweep.space import parse_space

    size = 1
    for name, distribution in parse_space(searched).distributions().items():
        choices = getattr(distribution, "choices", None)
        step = getattr(distribution, "step", None)
        if choices is not None:
            size *= len(choices)
        elif step is not None:
            size *= round((distribution.high - distribution.low) / step) + 1
        else:
            raise UserError(
                f"sweep.params.{name}: the grid sampler takes choice() and range() "
                "parameters; this one is continuous"
            )
    return size


def _slug(name: str) -> str:
    """A sweep name paiexp's jobs can be named after (letters, digits, '-')."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "app"
    return slug if slug[0].isalpha() else f"a{slug}"


def _returned_metric(name: str) -> dict[str, str]:
    """A metric the runner prints from the task's return value."""
    return {"name": name, "regex": f"^{job_runner.REPORT_PREFIX}{name}=(\\S+)$"}


def _results(outcome: SweepOutcome, prepared: PreparedSweep) -> dict[str, Any]:
    """What hydra-optuna-sweeper writes to ``optimization_results.yaml``."""
    study = outcome.study
    if not outcome.completed:
        return {"name": "paiexp", "best_params": {}, "best_value": None}
    if len(prepared.objectives) == 1:
        best = study.best_trial
        return {"name": "paiexp", "best_params": _app_params(best.params), "best_value": best.value}
    return {
        "name": "paiexp",
        "solutions": [
            {"params": _app_params(t.params), "values": list(t.values)} for t in study.best_trials
        ],
    }


def _app_params(params: dict[str, Any]) -> dict[str, Any]:
    return {_app_param(name): value for name, value in params.items()}


def _app_param(name: str) -> str:
    """The app's key of a trial parameter."""
    return name.removeprefix("job.hyperparameters.")
