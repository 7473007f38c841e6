"""The Optuna side of a sweep: objectives, storage, sampler and pruner, from the config.

Names are checked without importing Optuna (a typo is reported at once); the objects are
built when the sweep starts.  Sampler and pruner are not stored with a study, so a resumed
sweep rebuilds them from the same config.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paiexp.config.spec import creatable_path
from paiexp.config.tracker_uri import database_url_problem
from paiexp.errors import UserError
from paiexp.util.diskfull import disk_full
from paiexp.util.redact import redact_url, redact_urls
from paiexp.util.seconds import check_seconds

if TYPE_CHECKING:
    from paiexp.util.outage import Outage

SAMPLERS = {
    "tpe": "TPESampler",
    "random": "RandomSampler",
    "cmaes": "CmaEsSampler",
    "gp": "GPSampler",
    "qmc": "QMCSampler",
    "nsgaii": "NSGAIISampler",
    "nsgaiii": "NSGAIIISampler",
    "bruteforce": "BruteForceSampler",
}
PRUNERS = {
    "none": "NopPruner",
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
    "threshold": "ThresholdPruner",
    "patient": "PatientPruner",
    "wilcoxon": "WilcoxonPruner",
}


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str


@dataclass(frozen=True)
class PruningSignal:
    """Which metric feeds the pruner, and the sign that makes it point the study's way."""

    metric: str
    sign: float


def parse_objectives(value: Any, declared: Sequence[str]) -> list[Objective]:
    """``sweep.objective`` checked; ``declared``: the metrics the job declares."""
    from paiexp.config.schema import Direction  # with OmegaConf: not for the tracking process

    items = value if isinstance(value, list | tuple) else [value]
    if not items:
        raise UserError("sweep.objective: give {metric, direction} or a list of them")
    known = set(declared)
    objectives = []
    for index, item in enumerate(items):
        key = "sweep.objective" if len(items) == 1 else f"sweep.objective[{index}]"
        if not isinstance(item, Mapping) or set(item) - {"metric", "direction"}:
            raise UserError(f"{key}: expected {{metric: NAME, direction: minimize|maximize}}")
        metric, direction = item.get("metric"), item.get("direction", "minimize")
        if direction not in list(Direction):
            raise UserError(
                f"{key}.direction: invalid value {direction!r}; expected minimize or maximize"
            )
        if metric not in known:
            raise UserError(
                f"{key}.metric: {metric!r} is not a metric the job declares; "
                f"job.metric_definitions, job.tensorboard.metrics and job.mlflow_metrics have: "
                f"{', '.join(sorted(known)) or 'none'}"
            )
        objectives.append(Objective(str(metric), str(direction)))
    return objectives


def check_sweep_settings(
    sweep: Any, objectives: list[Objective], declared: Sequence[str]
) -> PruningSignal | None:
    """Validate the sweep's scalar settings; returns the pruning signal, if pruning."""
    if sweep.n_trials < 1:
        raise UserError(f"sweep.n_trials: must be >= 1, got {sweep.n_trials}")
    if sweep.parallelism < 1:
        raise UserError(f"sweep.parallelism: must be >= 1, got {sweep.parallelism}")
    if sweep.retries < 0:
        raise UserError(f"sweep.retries: must be >= 0, got {sweep.retries}")
    if sweep.max_failures is not None and sweep.max_failures < 1:
        raise UserError(f"sweep.max_failures: must be >= 1 or null, got {sweep.max_failures}")
    check_seconds("sweep.timeout", sweep.timeout, null=True)
    check_seconds("sweep.heartbeat_grace", sweep.heartbeat_grace)
    check_seconds("sweep.storage_outage_timeout", sweep.storage_outage_timeout)
    if sweep.sampler.name not in SAMPLERS:
        raise UserError(
            f"sweep.sampler.name: unknown sampler {sweep.sampler.name!r}; "
            f"available: {', '.join(SAMPLERS)}"
        )
    pruner = sweep.pruner
    if pruner.name not in PRUNERS:
        raise UserError(
            f"sweep.pruner.name: unknown pruner {pruner.name!r}; available: {', '.join(PRUNERS)}"
        )
    if pruner.name == "none":
        return None
    if len(objectives) > 1:
        raise UserError(
            "sweep.pruner.name: Optuna cannot prune multi-objective studies; use pruner none"
        )
    metric = pruner.metric or objectives[0].metric
    if metric not in declared:
        raise UserError(
            f"sweep.pruner.metric: {metric!r} is not a metric the job declares; "
            f"job.metric_definitions, job.tensorboard.metrics and job.mlflow_metrics have: "
            f"{', '.join(sorted(declared)) or 'none'}"
        )
    direction = pruner.direction or objectives[0].direction
    # Optuna's pruners read reported values in the study's direction.
    return PruningSignal(metric, 1.0 if direction == objectives[0].direction else -1.0)


def storage_location(storage: str, base_dir: Path) -> str:
    """An RDB URL as given, or a journal file path made absolute; one that cannot hold a
    study is a UserError naming ``sweep.storage``."""
    valid = "expected a journal file's path or a database URL (sqlite:///PATH, postgresql://...)"
    if "://" in storage:
        problem = database_url_problem(storage)
        if problem:
            raise UserError(f"sweep.storage: {redact_urls(storage)!r} {problem}; {valid}")
        return storage
    path = creatable_path("sweep.storage", storage, base_dir)
    if path.is_dir():
        raise UserError(f"sweep.storage: {storage!r} is a directory; {valid}")
    return str(path)


def create_storage(location: str, outage: Outage | None = None) -> Any:
    """The storage at ``location``; with ``outage``, a database server's is patient (see
    :mod:`paiexp.sweep.patient_storage`)."""
    from optuna.storages import JournalStorage

    from paiexp.sweep.journal import WholeRecordJournal

    if "://" in location:
        storage = rdb_storage(location)
        if outage is None:
            return storage
        from optuna.storages import get_storage

        from paiexp.sweep.patient_storage import PatientStorage

        # with the cache load_study would add; concrete (see patient_storage), mypy can't tell
        return PatientStorage(get_storage(storage), outage)  # type: ignore[abstract]
    try:
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(WholeRecordJournal(location))
    except OSError as exc:
        if disk_full(exc) is not None:
            raise
        raise UserError(
            f"sweep.storage: cannot create the journal {location} ({exc.strerror or exc})"
        ) from None


def storage_outage(
    location: str,
    limit: float,
    notify: Callable[[str], None],
    *,
    longest_wait: float | None = None,
) -> Outage:
    """How the outages of the study's database server are ridden out: tried again at least
    every ``longest_wait`` seconds (a launcher's heartbeat interval, so that it is back at
    work, heartbeating, that soon after the server is), else at the backoff's own pace."""
    from paiexp.util.outage import OUTAGE_BACKOFF, Outage, transient_database_error

    backoff = OUTAGE_BACKOFF
    if longest_wait is not None:
        backoff = replace(backoff, max_delay=min(backoff.max_delay, longest_wait))
    return Outage(
        service=f"study storage at {redact_url(location)}",
        key="sweep.storage_outage_timeout",
        limit=limit,
        transient=transient_database_error,
        notify=notify,
        backoff=backoff,
    )


def rdb_storage(url: str, attempts: int = 5) -> Any:
    """An RDB storage.  Launchers started together on a new database race to create Optuna's
    schema: the losers' statements fail, and their next try finds the schema made.  A
    database server that does not answer, or refuses the connection, is a UserError naming
    ``sweep.storage``."""
    import optuna
    import sqlalchemy

    from paiexp.util.outage import chain

    races = (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)
    failures = (*races, optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError)
    for attempt in range(1, attempts + 1):
        try:
            return optuna.storages.RDBStorage(url)
        except failures as exc:
            for error in chain(exc):
                if isinstance(error, sqlalchemy.exc.OperationalError):
                    raise UserError(_unusable_database(url, error)) from None
            if attempt == attempts:
                raise
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")  # the loop returns or raises


def _unusable_database(url: str, error: BaseException) -> str:
    from paiexp.util.outage import describe, transient_database_error

    if transient_database_error(error):
        return (
            f"sweep.storage: no database server answers at {redact_url(url)} "
            f"({describe(error)}); start it, or set sweep.storage to one that runs"
        )
    return f"sweep.storage: the database at {redact_url(url)} refuses the study: {describe(error)}"


def create_sampler(config: Any) -> Any:
    """The configured sampler.  Seeded, it samples trial N with a seed of (seed, N)
    (:mod:`paiexp.sweep.sampling`): reproducible, and distinct in every launcher sharing the
    study.  QMC keeps the seed as given: launchers must share its scrambled sequence, whose
    position is kept in the study."""
    import optuna

    from paiexp.sweep.sampling import AskTellBruteForceSampler

    cls: Any = getattr(optuna.samplers, SAMPLERS[config.name])
    if cls is optuna.samplers.BruteForceSampler:
        cls = AskTellBruteForceSampler
    options = dict(config.options)
    seed = options.pop("seed", config.seed)
    if seed is None or config.name == "qmc":
        return _construct(cls, {**options, "seed": seed}, "sweep.sampler.options")
    from paiexp.sweep.sampling import TrialSeededSampler

    _construct(cls, {**options, "seed": seed}, "sweep.sampler.options")  # options checked now
    return TrialSeededSampler(lambda trial_seed: cls(**options, seed=trial_seed), seed)


def create_pruner(config: Any) -> Any:
    import optuna

    cls = getattr(optuna.pruners, PRUNERS[config.name])
    if config.name == "none":  # switching pruning off keeps the options for later
        return cls()
    return _construct(cls, dict(config.options), "sweep.pruner.options")


def _construct(cls: Any, options: dict[str, Any], key: str) -> Any:
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{key}: {cls.__name__} rejects {options}: {exc}") from None
