"""A sweep checked whole before anything exists (:func:`prepare_sweep`), and what a launch of
it came to (:class:`SweepOutcome`): the types every part of a sweep shares, below them all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from paiexp.backends import Backend, create_backend
from paiexp.config.record import SourceInfo, source_info
from paiexp.config.schema import Config, SweepConfig
from paiexp.config.tracker_uri import check_tracker, tracking_uri
from paiexp.errors import UserError
from paiexp.sweep.space import SearchSpace, parse_space
from paiexp.sweep.spending import Budget, Projection, check_budget, projection, worst_spec
from paiexp.sweep.study import (
    Objective,
    PruningSignal,
    check_sweep_settings,
    parse_objectives,
    storage_location,
)
from paiexp.sweep.tracking_messages import BestRun
from paiexp.sweep.trials import TrialBuilder
from paiexp.tracking.cost import Prices
from paiexp.tracking.mlflow_tracker import check_tracking_server

if TYPE_CHECKING:
    from collections.abc import Callable

    from optuna import Study, Trial


@dataclass(frozen=True)
class PreparedSweep:
    """A validated sweep: nothing has been created yet."""

    config: Config
    sweep: SweepConfig
    space: SearchSpace
    trials: TrialBuilder
    objectives: list[Objective]
    pruning: PruningSignal | None
    storage: str
    study_name: str
    backend: Backend
    base_dir: Path
    overrides: tuple[str, ...]
    source: SourceInfo | None
    prices: Prices
    budget: Budget | None  # sweep.max_cost / max_instance_hours
    projection: Projection  # the most the sweep can cost
    # draws more of each trial's parameters once the space's are (a define-by-run space)
    extend_trial: Callable[[Trial], None] | None = None


def prepare_sweep(
    cfg: DictConfig, config: Config, base_dir: Path, overrides: tuple[str, ...]
) -> PreparedSweep:
    """Check everything a user can get wrong in a sweep, before any trial exists."""
    sweep = config.sweep
    assert sweep is not None
    space = parse_space(sweep.params)
    backend = create_backend(config.backend, base_dir)
    trials = TrialBuilder(cfg, space, base_dir)
    probe = trials.spec(space.first_point(), "validate")
    backend.validate(probe)
    objectives = parse_objectives(sweep.objective, probe.metric_names)
    pruning = check_sweep_settings(sweep, objectives, probe.metric_names)
    prices, budget = check_budget(sweep, probe, space, config.backend)
    if sweep.register is not None and len(objectives) > 1:
        raise UserError(
            "sweep.register: a multi-objective study has no one best trial to register; "
            "set sweep.register null"
        )
    _check_enqueued(sweep.enqueue, space)
    check_tracker(config.tracker)
    check_tracking_server(tracking_uri(config.tracker.uri))  # last: it asks the network
    return PreparedSweep(
        config=config,
        sweep=sweep,
        space=space,
        trials=trials,
        objectives=objectives,
        pruning=pruning,
        storage=storage_location(sweep.storage, base_dir),
        study_name=sweep.study_name or sweep.name,
        backend=backend,
        base_dir=base_dir,
        overrides=overrides,
        source=source_info(probe.source_dir),
        prices=prices,
        budget=budget,
        projection=projection(worst_spec(probe, space, prices), sweep.n_trials, prices),
    )


def _check_enqueued(points: list[dict[str, Any]], space: SearchSpace) -> None:
    """``sweep.enqueue``: each point's parameters searched ones, each value one Optuna takes
    for its distribution (out of its range is Optuna's warning; NaN, another type or choice
    would be its error as the trial is asked for)."""
    sampled = {name for name in space.params if name not in space.fixed()}
    distributions = space.distributions() if points else {}
    for index, point in enumerate(points):
        unknown = set(point) - sampled
        if unknown:
            raise UserError(
                f"sweep.enqueue[{index}]: {sorted(unknown)[0]!r} is not a searched "
                f"parameter; searched: {', '.join(sorted(sampled))}"
            )
        for name, value in point.items():
            try:
                distributions[name].to_internal_repr(value)
            except (TypeError, ValueError):
                raise UserError(
                    f"sweep.enqueue[{index}].{name}: invalid value {value!r}; expected a "
                    f"value of {space.params[name].describe()}"
                ) from None


@dataclass
class SweepOutcome:
    study: Study
    stop_reason: str | None
    failed: bool  # stopped by failures (max_failures, tracking), not by its budget
    interrupted: bool
    tracker_uri: str | None
    tracking_errors: list[str]
    experiment_id: str | None = None
    registered: str | None = None  # sweep.register's outcome
    best: BestRun | None = None  # the best trial's run and model, as MLflow has them

    @property
    def completed(self) -> bool:
        """Whether any trial of the study completed (a sweep without one failed)."""
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
