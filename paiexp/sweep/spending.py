"""What a sweep spends: per trial in the study, its totals, its budget and its projection.

Each trial records in the study what its job cost once it ended (``paiexp:instance_hours``,
``paiexp:cost``) and, while it runs, the most it can cost (``paiexp:most_*``: its instances
for ``job.max_run_time``): every launcher sharing the study reads the same totals.  A budget
(``sweep.max_cost``, ``sweep.max_instance_hours``) lets a trial start only while what is spent,
plus the most the running trials and this one can spend, stays within it; once the next trial
would pass it, the sweep stops submitting (trials in flight finish).  A budget needs
``job.max_run_time``: without it, nothing bounds what a running trial will spend.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paiexp.config.spec import JobSpec
from paiexp.errors import UserError
from paiexp.sweep.space import CategoricalParam, SearchSpace
from paiexp.tracking.cost import Prices, RunCost, most, prices_of

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

    from paiexp.config.schema import SweepConfig

SPENT_HOURS = "paiexp:instance_hours"
SPENT_COST = "paiexp:cost"
MOST_HOURS = "paiexp:most_instance_hours"
MOST_COST = "paiexp:most_cost"
CURRENCY = "paiexp:currency"


def record(attrs: dict[str, object], cost: RunCost, *, spent: bool) -> None:
    """A trial's cost (``spent``: what its job cost; else the most it can) as user attrs."""
    hours, money = (SPENT_HOURS, SPENT_COST) if spent else (MOST_HOURS, MOST_COST)
    attrs[hours] = cost.instance_hours
    if cost.cost is not None:
        attrs[money] = cost.cost
        attrs[CURRENCY] = cost.currency


def trial_cost(trial: FrozenTrial, *, spent: bool = True) -> RunCost | None:
    """What a trial's job cost (``spent``; else the most it can), as the study recorded it;
    None: nothing recorded."""
    hours, money = (SPENT_HOURS, SPENT_COST) if spent else (MOST_HOURS, MOST_COST)
    if hours not in trial.user_attrs:
        return None
    cost = trial.user_attrs.get(money)
    currency = trial.user_attrs.get(CURRENCY)
    return RunCost(float(trial.user_attrs[hours]), None if cost is None else float(cost), currency)


def spent(trials: Iterable[FrozenTrial]) -> RunCost | None:
    """What the trials' jobs cost in all (retried ones too: they were billed); money only
    when every one was priced; None when none recorded a cost."""
    costs = [c for c in (trial_cost(t) for t in trials) if c is not None]
    return sum(costs[1:], costs[0]) if costs else None


def committed(trials: Iterable[FrozenTrial]) -> RunCost:
    """The most the running trials may cost (their whole bound: an upper one)."""
    from optuna.trial import TrialState

    total = RunCost(0.0, 0.0)
    for trial in trials:
        most_of = trial_cost(trial, spent=False) if trial.state is TrialState.RUNNING else None
        if most_of is not None:
            total += most_of
    return total


@dataclass(frozen=True)
class Budget:
    """``sweep.max_cost`` / ``sweep.max_instance_hours`` and the most a next trial costs."""

    max_cost: float | None
    max_instance_hours: float | None
    next_trial: RunCost  # the most one more trial can cost
    currency: str | None

    def why_stop(self, study: Study) -> str | None:
        """Why no more trial may start, if the next one could pass a budget."""
        trials = study.get_trials(deepcopy=False)
        done = spent(trials) or RunCost(0.0, 0.0)
        worst = done + committed(trials) + self.next_trial
        if self.max_cost is not None and (worst.cost or 0.0) > self.max_cost:
            return (
                f"sweep.max_cost of {self.max_cost:g} {self.currency} reached: "
                f"{(done.cost or 0.0):.2f} spent, {(worst.cost or 0.0):.2f} at most "
                "with the running trials and one more"
            )
        if self.max_instance_hours is not None and worst.instance_hours > self.max_instance_hours:
            return (
                f"sweep.max_instance_hours of {self.max_instance_hours:g} reached: "
                f"{done.instance_hours:.3g} spent, {worst.instance_hours:.3g} at most "
                "with the running trials and one more"
            )
        return None


@dataclass(frozen=True)
class Projection:
    """The most a sweep can cost: ``n_trials`` trials, each its most (None: no bound)."""

    n_trials: int
    per_trial: RunCost | None
    instance_type: str | None
    instance_count: int
    max_run_time: int | None

    @property
    def total(self) -> RunCost | None:
        if self.per_trial is None:
            return None
        one = self.per_trial
        cost = None if one.cost is None else one.cost * self.n_trials
        return RunCost(one.instance_hours * self.n_trials, cost, one.currency)

    def line(self) -> str:
        """``at most: 6 trials x 1 x ecs.g6.2xlarge x 3600 s = 6 instance-h, 12.12 CNY``."""
        kind = self.instance_type or "no instance type"
        if self.per_trial is None or self.total is None:
            return f"at most: no bound (job.max_run_time is not set; {kind})"
        unpriced = "" if self.total.cost is not None else f" (no price for {kind})"
        return (
            f"at most: {self.n_trials} trials x {self.instance_count} x {kind} x "
            f"{self.max_run_time} s = {self.total.text()}{unpriced}"
        )


def worst_spec(spec: JobSpec, space: SearchSpace, prices: Prices) -> JobSpec:
    """The trial job that costs the most: ``spec`` on the dearest instance type swept."""
    import dataclasses

    param = space.params.get("job.instance_type")
    if not isinstance(param, CategoricalParam):
        return spec
    kinds = [str(c) for c in param.choices]
    dearest = max(kinds, key=lambda k: prices.hourly(k) or 0.0)
    return dataclasses.replace(spec, instance_type=dearest)


def projection(spec: JobSpec, n_trials: int, prices: Prices) -> Projection:
    per_trial = most(spec.instance_type, spec.instance_count, spec.max_run_time, prices)
    return Projection(
        n_trials, per_trial, spec.instance_type, spec.instance_count, spec.max_run_time
    )


def check_budget(
    sweep: SweepConfig, spec: JobSpec, space: SearchSpace, backend: object
) -> tuple[Prices, Budget | None]:
    """``backend.prices`` and the sweep's budget, checked: a UserError naming the key."""
    prices = prices_of(backend)
    for key in ("max_cost", "max_instance_hours"):
        value = getattr(sweep, key)
        if value is not None and not value > 0:
            raise UserError(f"sweep.{key}: must be > 0 or null, got {value:g}")
    if sweep.max_cost is None and sweep.max_instance_hours is None:
        return prices, None
    for swept in ("job.instance_count", "job.max_run_time"):
        if swept in space.params and swept not in space.fixed():
            raise UserError(f"sweep.params.{swept}: cannot be swept with a budget (sweep.max_*)")
    if spec.max_run_time is None:
        raise UserError(
            "job.max_run_time: needed with sweep.max_cost or sweep.max_instance_hours "
            "(seconds; without it nothing bounds what a running trial spends)"
        )
    worst = worst_spec(spec, space, prices)
    kinds = _instance_types(spec, space)
    if sweep.max_cost is not None:
        unpriced = [k for k in kinds if prices.hourly(k) is None]
        if unpriced:
            known = ", ".join(prices.per_hour) or "none"
            raise UserError(
                f"sweep.max_cost: needs backend.prices.per_hour for instance type "
                f"{unpriced[0] or '(job.instance_type not set)'}; priced: {known}"
            )
    next_trial = most(worst.instance_type, worst.instance_count, worst.max_run_time, prices)
    assert next_trial is not None
    budget = Budget(sweep.max_cost, sweep.max_instance_hours, next_trial, prices.currency)
    return prices, budget


def _instance_types(spec: JobSpec, space: SearchSpace) -> list[str | None]:
    param = space.params.get("job.instance_type")
    if isinstance(param, CategoricalParam):
        return [str(c) for c in param.choices]
    return [spec.instance_type]
