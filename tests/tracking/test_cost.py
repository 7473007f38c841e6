"""What a run costs (paiexp/tracking/cost.py): instances x hours x the price, a spot job at most at
its
discount limit, instance-hours alone where no price is known."""

from __future__ import annotations

import pytest

from paiexp.config.schema import PaiBackendConfig, PaiSpotConfig, PricesConfig, SpotStrategy
from paiexp.tracking.cost import prices_of, run_cost

PRICE = 2.02  # CNY per hour of ecs.g6.2xlarge (DESIGN §11)


def pai(spot: PaiSpotConfig | None = None) -> PaiBackendConfig:
    prices = PricesConfig(currency="CNY", per_hour={"ecs.g6.2xlarge": PRICE})
    return PaiBackendConfig(prices=prices, spot=spot or PaiSpotConfig())


def test_every_instance_is_billed_for_the_time_the_job_ran() -> None:
    cost = run_cost("ecs.g6.2xlarge", 2, 1000.0, 1000.0 + 1800, prices_of(pai()))
    assert cost is not None
    assert cost.instance_hours == pytest.approx(1.0)  # 2 instances x half an hour
    assert cost.cost == pytest.approx(PRICE) and cost.currency == "CNY"
    assert cost.text() == "1 instance-h, 2.02 CNY"


@pytest.mark.parametrize(
    ("strategy", "limit", "paid"),
    [
        (SpotStrategy.SpotWithPriceLimit, 0.5, 0.5),  # at most half the price
        (SpotStrategy.SpotAsPriceGo, None, 1.0),  # at most the on-demand price
        (None, 0.5, 1.0),  # on demand: a limit without spot means nothing
    ],
)
def test_a_spot_job_is_priced_at_most_at_its_discount_limit(
    strategy: SpotStrategy | None, limit: float | None, paid: float
) -> None:
    prices = prices_of(pai(PaiSpotConfig(strategy=strategy, discount_limit=limit)))
    cost = run_cost("ecs.g6.2xlarge", 1, 0.0, 3600.0, prices)
    assert cost is not None and cost.cost == pytest.approx(PRICE * paid)


def test_an_instance_type_without_a_price_records_its_hours_alone() -> None:
    cost = run_cost("ecs.c6.large", 1, 0.0, 7200.0, prices_of(pai()))
    assert cost is not None and cost.instance_hours == pytest.approx(2.0)
    assert cost.cost is None and cost.currency is None
    assert "cost" not in cost.metrics()
