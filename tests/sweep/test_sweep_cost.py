"""What a sweep costs on backend=local: instance-hours and cost per trial, totals on the parent,
budgets that stop submitting, the projection before a launch, and bad prices or budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import all_runs, assert_nothing_started, assert_one_line_error, run_paiexp
from sweep_helpers import load_study, sweep_runs, synthetic_project

import paiexp

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

PRICE = 2.02  # CNY per hour of ecs.g6.2xlarge (DESIGN §11): an example, not a fact shipped
HOUR = 3600  # job.max_run_time: each trial at most one instance-hour, PRICE CNY


def priced_project(root: Path, sweep: dict[str, Any], prices: dict[str, Any] | None = None) -> Path:
    """The synthetic project on ecs.g6.2xlarge with ``backend.prices`` set in config.yaml."""
    job = {"instance_type": "ecs.g6.2xlarge", "max_run_time": HOUR}
    root = synthetic_project(root, sweep, job)
    config_file = root / "conf" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    if prices is None:
        prices = {"currency": "CNY", "per_hour": {"ecs.g6.2xlarge": PRICE}}
    config["backend"] = {"prices": prices}
    config_file.write_text(yaml.safe_dump(config))
    return root


def test_every_trial_records_its_cost_and_the_parent_their_sums(tmp_path: Path) -> None:
    root = priced_project(
        tmp_path, {"params": {"x": "interval(-1, 1)", "duration": 0.2}, "n_trials": 6}
    )
    result = run_paiexp(root, "+sweep=syn")
    assert result.returncode == 0, result.stderr
    assert "at most: 6 trials x 1 x ecs.g6.2xlarge x 3600 s = 6 instance-h, 12.12 CNY" in (
        result.stderr
    )
    (parent,), children = sweep_runs(root)
    assert len(children) == 6
    for child in children:
        hours = child.data.metrics["instance_hours"]
        assert 0 < hours < 60 / 3600  # a job of well under a minute
        assert child.data.metrics["cost"] == pytest.approx(hours * PRICE)
        assert child.data.tags["paiexp.currency"] == "CNY"
    total_hours = sum(c.data.metrics["instance_hours"] for c in children)
    total_cost = sum(c.data.metrics["cost"] for c in children)
    assert parent.data.metrics["instance_hours"] == pytest.approx(total_hours)
    assert parent.data.metrics["cost"] == pytest.approx(total_cost)
    assert parent.data.tags["paiexp.currency"] == "CNY"
    assert f"cost: {total_hours:.3g} instance-h, {total_cost:.2f} CNY" in result.stderr
    sweep = paiexp.attach_sweep("syn", project=root)
    results = sweep.results()
    assert results["cost"].sum() == pytest.approx(total_cost)
    assert set(results["currency"]) == {"CNY"}
    assert f"cost {total_hours:.3g} instance-h, {total_cost:.2f} CNY" in sweep.status()


def test_a_single_run_records_what_it_cost(tmp_path: Path) -> None:
    root = priced_project(tmp_path, {"params": {"x": "interval(-1, 1)"}, "n_trials": 1})
    result = run_paiexp(root, "job.hyperparameters.duration=0.2")
    assert result.returncode == 0, result.stderr
    (run,) = all_runs(root)
    hours = run.data.metrics["instance_hours"]
    assert 0 < hours < 60 / 3600
    assert run.data.metrics["cost"] == pytest.approx(hours * PRICE)
    assert run.data.tags["paiexp.currency"] == "CNY"
    assert f"cost: {hours:.3g} instance-h, {hours * PRICE:.2f} CNY" in result.stderr


def test_dry_run_gives_the_projection_without_launching(tmp_path: Path) -> None:
    root = priced_project(tmp_path, {"params": {"x": "interval(-1, 1)"}, "n_trials": 4})
    result = run_paiexp(root, "+sweep=syn", "--dry-run")
    assert result.returncode == 0, result.stderr
    line = "at most: 4 trials x 1 x ecs.g6.2xlarge x 3600 s = 4 instance-h, 8.08 CNY"
    assert result.stdout.strip() == line
    assert_nothing_started(root)
    projection = paiexp.from_project("+sweep=syn", project=root).projection()
    assert projection.line() == line
    assert projection.total is not None and projection.total.cost == pytest.approx(4 * PRICE)
    assert_nothing_started(root)


def test_a_grids_dry_run_gives_its_projection_and_a_pipelines_is_refused(tmp_path: Path) -> None:
    """``-m`` and ``+pipeline`` with ``--dry-run`` ran their jobs; a dry run never runs one."""
    root = priced_project(tmp_path, {"params": {"x": "interval(-1, 1)"}, "n_trials": 4})
    grid = run_paiexp(root, "-m", "job.hyperparameters.x=1,2,3", "--dry-run")
    assert grid.returncode == 0, grid.stderr
    line = "at most: 3 trials x 1 x ecs.g6.2xlarge x 3600 s = 3 instance-h, 6.06 CNY"
    assert grid.stdout.strip() == line
    assert_nothing_started(root)
    pipelines = root / "pipelines"
    pipelines.mkdir()
    (pipelines / "p.yaml").write_text("pipeline:\n  steps:\n    one: {}\n")
    refused = assert_one_line_error(run_paiexp(root, "+pipeline=p", "--dry-run"))
    assert refused.startswith("paiexp: error: --dry-run: a pipeline's cost is not projected")
    assert_nothing_started(root)


def test_max_cost_stops_submitting_before_the_next_trial_could_pass_it(tmp_path: Path) -> None:
    """Deterministic: the loop submits while it may before it polls, so the trials in flight
    decide: 2 x 2.02 fits in 5, a third 2.02 would not."""
    root = priced_project(
        tmp_path,
        {"params": {"x": "interval(-1, 1)"}, "n_trials": 6, "parallelism": 3, "max_cost": 5.0},
    )
    result = run_paiexp(root, "+sweep=syn")
    assert result.returncode == 0, result.stderr
    assert "stopped submitting: sweep.max_cost of 5 CNY reached" in result.stderr
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    _, children = sweep_runs(root)
    spent = sum(c.data.metrics["cost"] for c in children)
    assert spent <= 5.0  # nothing in flight can pass it: each trial is bounded by max_run_time


def test_max_instance_hours_stops_submitting(tmp_path: Path) -> None:
    root = priced_project(
        tmp_path,
        {
            "params": {"x": "interval(-1, 1)"},
            "n_trials": 6,
            "parallelism": 2,
            "max_instance_hours": 1.5,
        },
        prices={},
    )
    result = run_paiexp(root, "+sweep=syn")
    assert result.returncode == 0, result.stderr
    assert "sweep.max_instance_hours of 1.5 reached" in result.stderr
    assert [t.state.name for t in load_study(root).trials] == ["COMPLETE"]
    _, (child,) = sweep_runs(root)
    assert "cost" not in child.data.metrics  # no price: instance-hours only
    assert child.data.metrics["instance_hours"] > 0


@pytest.mark.parametrize(
    ("prices", "args", "mentions"),
    [
        (
            {"currency": "CNY", "per_hour": {"ecs.g6.2xlarge": -1}},
            (),
            ("backend.prices.per_hour.ecs.g6.2xlarge", ">= 0"),
        ),
        ({"per_hour": {"ecs.g6.2xlarge": 1}}, (), ("backend.prices.currency", "CNY")),
        ({}, ("sweep.max_cost=3",), ("sweep.max_cost", "ecs.g6.2xlarge", "backend.prices")),
        (None, ("sweep.max_cost=-3",), ("sweep.max_cost", "> 0")),
        (None, ("sweep.max_instance_hours=0",), ("sweep.max_instance_hours", "> 0")),
        (None, ("sweep.max_cost=3", "job.max_run_time=null"), ("job.max_run_time",)),
    ],
)
def test_bad_prices_and_budgets_are_one_line_before_anything_starts(
    tmp_path: Path, prices: dict[str, Any] | None, args: tuple[str, ...], mentions: tuple[str, ...]
) -> None:
    root = priced_project(tmp_path, {"params": {"x": "interval(-1, 1)"}}, prices=prices)
    result = run_paiexp(root, "+sweep=syn", *args)
    line = assert_one_line_error(result)
    assert all(m in line for m in mentions), line
    assert_nothing_started(root)


def test_a_single_run_with_a_bad_price_is_one_line_before_it_starts(tmp_path: Path) -> None:
    prices = {"currency": "CNY", "per_hour": {"ecs.g6.2xlarge": -1}}
    root = priced_project(tmp_path, {"params": {"x": "interval(-1, 1)"}}, prices=prices)
    line = assert_one_line_error(run_paiexp(root))
    assert "backend.prices.per_hour.ecs.g6.2xlarge" in line and ">= 0" in line, line
    assert_nothing_started(root)
