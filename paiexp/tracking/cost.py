"""What a run costs: instance-hours as PAI bills them, priced by ``backend.prices``.

Instance-hours are ``job.instance_count`` x the job's wall-clock from its start to its end
(the backend's ``started_at``/``ended_at``; where a backend gives none, from its submission to
the end the launcher saw, which can only count more).  A price is per hour of one instance
of ``job.instance_type``, on every backend alike (on local and docker it prices what the job
would cost on that instance type); a spot job with ``SpotWithPriceLimit`` is priced at its
discount limit, the most it can pay; ``SpotAsPriceGo`` at the on-demand price, its cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paiexp.errors import UserError

INSTANCE_HOURS = "instance_hours"  # the metrics a run records
COST = "cost"
CURRENCY_TAG = "paiexp.currency"
PRICE_TAG = "paiexp.price_per_hour"


@dataclass(frozen=True)
class Prices:
    """``backend.prices``, checked; ``spot``: the fraction of a price a spot job pays at most."""

    per_hour: dict[str, float]
    currency: str | None
    spot: float = 1.0

    def hourly(self, instance_type: str | None) -> float | None:
        """One instance's price per hour, None when ``backend.prices`` has none for it."""
        price = self.per_hour.get(instance_type) if instance_type else None
        return None if price is None else price * self.spot


def prices_of(backend: Any) -> Prices:
    """A backend config's prices; a UserError naming the key for a bad one."""
    config = getattr(backend, "prices", None)
    per_hour = {str(k): float(v) for k, v in (config.per_hour if config else {}).items()}
    for name, price in per_hour.items():
        if not price >= 0:
            raise UserError(
                f"backend.prices.per_hour.{name}: invalid price {price:g}; "
                "expected a price per hour >= 0"
            )
    currency = config.currency if config else None
    if per_hour and not currency:
        raise UserError("backend.prices.currency: needed with backend.prices.per_hour, e.g. CNY")
    spot = getattr(backend, "spot", None)
    discount = 1.0
    if spot is not None and spot.strategy == "SpotWithPriceLimit" and spot.discount_limit:
        discount = min(float(spot.discount_limit), 1.0)
    return Prices(per_hour, currency, discount)


@dataclass(frozen=True)
class RunCost:
    """Instance-hours and, where priced, money."""

    instance_hours: float
    cost: float | None = None
    currency: str | None = None

    def __add__(self, other: RunCost) -> RunCost:
        priced = self.cost is not None and other.cost is not None
        return RunCost(
            self.instance_hours + other.instance_hours,
            (self.cost or 0.0) + (other.cost or 0.0) if priced else None,
            self.currency or other.currency,
        )

    def metrics(self) -> dict[str, float]:
        priced = {COST: self.cost} if self.cost is not None else {}
        return {INSTANCE_HOURS: self.instance_hours, **priced}

    def text(self) -> str:
        """``3.2 instance-h, 6.46 CNY``."""
        money = f", {self.cost:.2f} {self.currency}" if self.cost is not None else ""
        return f"{self.instance_hours:.3g} instance-h{money}"


def priced(hours: float, instance_type: str | None, prices: Prices) -> RunCost:
    """``hours`` instance-hours of ``instance_type`` at its price (none: unpriced)."""
    price = prices.hourly(instance_type)
    cost = None if price is None else hours * price
    return RunCost(hours, cost, prices.currency if cost is not None else None)


def run_cost(
    instance_type: str | None,
    instance_count: int,
    started_at: float | None,
    ended_at: float | None,
    prices: Prices,
) -> RunCost | None:
    """What a job that ran from ``started_at`` to ``ended_at`` (epoch seconds) cost; None
    without both."""
    if started_at is None or ended_at is None:
        return None
    hours = instance_count * max(ended_at - started_at, 0.0) / 3600
    return priced(hours, instance_type, prices)


def most(
    instance_type: str | None, instance_count: int, max_run_time: int | None, prices: Prices
) -> RunCost | None:
    """The most a job can cost: its instances for ``max_run_time`` seconds (None: no bound)."""
    if max_run_time is None:
        return None
    return priced(instance_count * max_run_time / 3600, instance_type, prices)
