"""``sweep.params`` parsing: every accepted spelling, its errors, and Optuna's distributions.

Pure unit tests of :mod:`paiexp.sweep.space`: no subprocess, no job, no study.
"""

from __future__ import annotations

from typing import Any

import optuna
import pytest
import yaml
from conftest import REPO

from paiexp.errors import UserError
from paiexp.sweep.space import (
    CategoricalParam,
    FixedParam,
    FloatParam,
    IntParam,
    Param,
    SearchSpace,
    parse_space,
)

# A searched param beside the one under test, so that a fixed value alone is not an error.
OTHER = {"other": "choice(x, y)"}


def parse_one(value: Any, name: str = "p") -> Param:
    """The parsed form of one ``sweep.params`` entry."""
    return parse_space({name: value, **OTHER}).params[name]


def parse_error(value: Any, name: str = "p") -> str:
    """The UserError message of one bad ``sweep.params`` entry."""
    with pytest.raises(UserError) as info:
        parse_space({name: value, **OTHER})
    return str(info.value)


# --- hydra-optuna-sweeper strings ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("interval(0.1, 1)", FloatParam(0.1, 1.0), id="interval"),
        pytest.param("interval(1, 10)", FloatParam(1.0, 10.0), id="interval-of-ints-is-float"),
        pytest.param("int(interval(1, 10))", IntParam(1, 10), id="int-interval"),
        pytest.param(
            "tag(log, interval(0.001, 1))", FloatParam(0.001, 1.0, log=True), id="log-interval"
        ),
        pytest.param(
            "tag(log, int(interval(1, 100)))", IntParam(1, 100, log=True), id="log-int-interval"
        ),
        pytest.param("choice(a, b, 3)", CategoricalParam(("a", "b", 3)), id="choice"),
        pytest.param(
            "choice('hello world', b)",
            CategoricalParam(("hello world", "b")),
            id="choice-single-quoted-space",
        ),
        pytest.param(
            'choice("x y", z)', CategoricalParam(("x y", "z")), id="choice-double-quoted-space"
        ),
        pytest.param("choice(true, 1.5)", CategoricalParam((True, 1.5)), id="choice-typed"),
    ],
)
def test_sweeper_string_forms(text: str, expected: Param) -> None:
    parsed = parse_one(text)
    assert parsed == expected
    assert type(parsed) is type(expected)


def test_interval_values_are_typed() -> None:
    float_param = parse_one("interval(0.1, 1)")
    assert isinstance(float_param, FloatParam)
    assert isinstance(float_param.low, float) and isinstance(float_param.high, float)
    int_param = parse_one("int(interval(1, 10))")
    assert isinstance(int_param, IntParam)
    assert isinstance(int_param.low, int) and isinstance(int_param.high, int)


# --- range: the end point is excluded ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("range(1, 10)", IntParam(1, 9), id="default-step"),
        pytest.param("range(1, 10, 2)", IntParam(1, 9, step=2), id="step-2"),
        pytest.param("range(1, 11, 2)", IntParam(1, 9, step=2), id="end-on-grid-excluded"),
        pytest.param("range(1, 2)", IntParam(1, 1), id="single-value"),
        pytest.param("range(50, 301, 50)", IntParam(50, 300, step=50), id="xgb-n-estimators"),
        pytest.param("range(0, 1, 0.25)", FloatParam(0.0, 0.75, step=0.25), id="float-step"),
        pytest.param("range(0, 0.3, 0.1)", FloatParam(0.0, 0.2, step=0.1), id="float-tenths"),
        pytest.param("range(0, 1.1, 0.1)", FloatParam(0.0, 1.0, step=0.1), id="float-to-1"),
    ],
)
def test_range_excludes_its_end(text: str, expected: Param) -> None:
    parsed = parse_one(text)
    assert type(parsed) is type(expected)
    assert parsed.low == pytest.approx(expected.low)  # type: ignore[union-attr]
    assert parsed.high == pytest.approx(expected.high)  # type: ignore[union-attr]
    assert parsed.step == pytest.approx(expected.step)  # type: ignore[union-attr]
    assert parsed.log is False  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "high"),
    [("range(1, 2.2, 0.2)", 2.0), ("range(0.5, 1.1, 0.2)", 0.9)],
)
def test_float_range_excludes_its_end_despite_rounding(text: str, high: float) -> None:
    parsed = parse_one(text)
    assert isinstance(parsed, FloatParam)
    assert parsed.high == pytest.approx(high)


def test_empty_range_is_an_error_naming_the_key() -> None:
    message = parse_error("range(5, 5)", name="max_depth")
    assert message.startswith("sweep.params.max_depth"), message
    assert "empty" in message


def test_backwards_range_is_empty() -> None:
    message = parse_error("range(10, 1)", name="max_depth")
    assert message.startswith("sweep.params.max_depth"), message
    assert "empty" in message


def test_negative_range_step_is_an_error() -> None:
    message = parse_error("range(10, 1, -1)", name="max_depth")
    assert message.startswith("sweep.params.max_depth"), message
    assert "step" in message and "-1" in message


def test_shuffled_range_is_an_error() -> None:
    message = parse_error("shuffle(range(1, 3))")
    assert message.startswith("sweep.params.p"), message
    assert "shuffle" in message


@pytest.mark.parametrize(
    "text",
    ["tag(log, interval(0, 1))", "interval(5, 1)", "glob(*)", "choice([1, 2], 3)"],
)
def test_bad_sweeper_strings_name_the_key(text: str) -> None:
    assert parse_error(text, name="lr").startswith("sweep.params.lr"), text


@pytest.mark.parametrize("text", ["interval(0.1)", "range()", "choice()"])
def test_sweep_function_with_wrong_arguments_is_a_user_error(text: str) -> None:
    assert parse_error(text, name="lr").startswith("sweep.params.lr")


# --- structured forms -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"type": "float", "low": 0.01, "high": 0.3, "log": True},
            FloatParam(0.01, 0.3, log=True),
            id="float-log",
        ),
        pytest.param(
            {"type": "float", "low": 0, "high": 1, "step": 0.1},
            FloatParam(0.0, 1.0, step=0.1),
            id="float-step",
        ),
        pytest.param(
            {"type": "int", "low": 2, "high": 10, "step": 2}, IntParam(2, 10, step=2), id="int"
        ),
        pytest.param(
            {"type": "int", "low": 2.0, "high": 10.0}, IntParam(2, 10), id="int-whole-floats"
        ),
        pytest.param(
            {"type": "int", "low": 1, "high": 100, "log": True},
            IntParam(1, 100, log=True),
            id="int-log",
        ),
        pytest.param(
            {"type": "categorical", "choices": ["gbtree", "dart", 3]},
            CategoricalParam(("gbtree", "dart", 3)),
            id="categorical",
        ),
    ],
)
def test_structured_forms(spec: dict[str, Any], expected: Param) -> None:
    parsed = parse_one(spec)
    assert parsed == expected
    assert type(parsed) is type(expected)


@pytest.mark.parametrize(
    ("spec", "mentions"),
    [
        pytest.param(
            {"type": "uniform", "low": 0, "high": 1},
            ("sweep.params.p.type", "uniform", "float, int or categorical"),
            id="unknown-type",
        ),
        pytest.param(
            {"low": 0, "high": 1}, ("sweep.params.p.type", "categorical"), id="missing-type"
        ),
        pytest.param(
            {"type": "float", "low": 0, "high": 1, "lgo": True},
            ("'lgo'", "high, log, low, step"),
            id="unknown-extra-key",
        ),
        pytest.param(
            {"type": "categorical", "choices": ["a"], "low": 1},
            ("'low'", "choices"),
            id="bound-on-categorical",
        ),
        pytest.param(
            {"type": "float", "low": 2, "high": 1}, ("low (2)", "high (1)"), id="low-above-high"
        ),
        pytest.param(
            {"type": "float", "low": 0, "high": 1, "log": True}, ("log", "low > 0"), id="log-zero"
        ),
        pytest.param(
            {"type": "float", "low": -1, "high": 1, "log": True},
            ("log", "low > 0"),
            id="log-negative",
        ),
        pytest.param(
            {"type": "int", "low": 1.5, "high": 10}, ("int", "whole-number"), id="int-fraction"
        ),
        pytest.param(
            {"type": "int", "low": 1, "high": 10, "step": 1.5},
            ("int", "whole-number"),
            id="int-fraction-step",
        ),
        pytest.param({"type": "float", "high": 1}, ("sweep.params.p.low",), id="missing-low"),
        pytest.param({"type": "float", "low": 0}, ("sweep.params.p.high",), id="missing-high"),
        pytest.param(
            {"type": "float", "low": "a", "high": 1}, ("sweep.params.p.low",), id="string-low"
        ),
        pytest.param(
            {"type": "float", "low": True, "high": 1}, ("sweep.params.p.low",), id="bool-low"
        ),
        pytest.param(
            {"type": "int", "low": 1, "high": 10, "step": 0},
            ("sweep.params.p.step", "> 0"),
            id="zero-step",
        ),
        pytest.param(
            {"type": "float", "low": 0.1, "high": 1, "log": True, "step": 0.1},
            ("log and step",),
            id="log-with-step",
        ),
        pytest.param(
            {"type": "categorical", "choices": []},
            ("sweep.params.p.choices", "non-empty"),
            id="empty-choices",
        ),
        pytest.param({"type": "categorical"}, ("sweep.params.p.choices",), id="missing-choices"),
        pytest.param(
            {"type": "categorical", "choices": "a"},
            ("sweep.params.p.choices",),
            id="choices-not-a-list",
        ),
    ],
)
def test_structured_errors_name_the_param(spec: dict[str, Any], mentions: tuple[str, ...]) -> None:
    message = parse_error(spec)
    assert message.startswith("sweep.params.p"), message
    for text in mentions:
        assert text in message, f"{text!r} not in {message!r}"


def test_non_boolean_log_is_an_error() -> None:
    message = parse_error({"type": "float", "low": 0.1, "high": 1, "log": "false"})
    assert message.startswith("sweep.params.p")


# --- fixed parameters -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hello", "hello"),
        ("a b", "a b"),
        (7, 7),
        (0.5, 0.5),
        (True, True),
        (None, None),
    ],
)
def test_plain_values_are_fixed(value: Any, expected: Any) -> None:
    parsed = parse_one(value)
    assert parsed == FixedParam(expected)
    assert type(parsed.value) is type(expected)  # type: ignore[union-attr]


def test_fixed_params_are_listed_apart() -> None:
    space = parse_space({"seed": 7, "booster": "gbtree", "max_depth": "int(interval(2, 4))"})
    assert space.fixed() == {"seed": 7, "booster": "gbtree"}


@pytest.mark.parametrize("value", [[1, 2], (1, 2), ["a"]])
def test_list_value_is_ambiguous(value: Any) -> None:
    message = parse_error(value, name="max_depth")
    assert message.startswith("sweep.params.max_depth"), message
    assert "choice(" in message


@pytest.mark.parametrize(
    "params", [{"seed": 7}, {"seed": 7, "booster": "gbtree", "lr": 0.5}, {}], ids=str
)
def test_only_fixed_params_is_nothing_to_search(params: dict[str, Any]) -> None:
    with pytest.raises(UserError, match="nothing to search") as info:
        parse_space(params)
    assert str(info.value).startswith("sweep.params")


# --- config keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("max_depth", "job.hyperparameters.max_depth"),
        ("train.lr", "job.hyperparameters.train.lr"),
        ("job.instance_type", "job.instance_type"),
        ("backend.poll_interval", "backend.poll_interval"),
        ("jobs", "job.hyperparameters.jobs"),
        ("backend_x", "job.hyperparameters.backend_x"),
    ],
)
def test_config_key(name: str, key: str) -> None:
    assert SearchSpace.config_key(name) == key


# --- Optuna distributions, first point, descriptions ------------------------------------------

MIXED = {
    "lr": "tag(log, interval(0.001, 1))",
    "depth": "int(interval(2, 10))",
    "trees": "range(50, 301, 50)",
    "frac": "range(0, 1, 0.25)",
    "leaves": "tag(log, int(interval(1, 100)))",
    "booster": "choice(gbtree, dart)",
    "gamma": {"type": "float", "low": 0.0, "high": 5.0},
    "seed": 42,
    "objective": "binary:logistic",
}


def test_distributions_match_the_params() -> None:
    dists = parse_space(MIXED).distributions()
    assert dists == {
        "lr": optuna.distributions.FloatDistribution(0.001, 1.0, log=True),
        "depth": optuna.distributions.IntDistribution(2, 10),
        "trees": optuna.distributions.IntDistribution(50, 300, step=50),
        "frac": optuna.distributions.FloatDistribution(0.0, 0.75, step=0.25),
        "leaves": optuna.distributions.IntDistribution(1, 100, log=True),
        "booster": optuna.distributions.CategoricalDistribution(("gbtree", "dart")),
        "gamma": optuna.distributions.FloatDistribution(0.0, 5.0),
    }
    assert "seed" not in dists and "objective" not in dists


def test_first_point_is_low_first_choice_or_fixed_value() -> None:
    assert parse_space(MIXED).first_point() == {
        "lr": 0.001,
        "depth": 2,
        "trees": 50,
        "frac": 0.0,
        "leaves": 1,
        "booster": "gbtree",
        "gamma": 0.0,
        "seed": 42,
        "objective": "binary:logistic",
    }


def test_first_point_lies_in_every_distribution() -> None:
    space = parse_space(MIXED)
    point = space.first_point()
    for name, dist in space.distributions().items():
        assert dist._contains(dist.to_internal_repr(point[name])), name


@pytest.mark.parametrize(
    ("value", "mentions"),
    [
        ("tag(log, interval(0.001, 1))", ("float", "0.001", "1", "log")),
        ("tag(log, int(interval(1, 100)))", ("int", "1", "100", "log")),
        ("range(1, 10, 2)", ("int", "1", "9", "step 2")),
        ("range(0, 1, 0.25)", ("float", "0.75", "step 0.25")),
        ("interval(0.5, 1.0)", ("float", "0.5", "1")),
        ("choice(gbtree, dart)", ("gbtree", "dart")),
        (7, ("fixed", "7")),
    ],
)
def test_describe_is_informative(value: Any, mentions: tuple[str, ...]) -> None:
    text = parse_one(value).describe()
    for part in mentions:
        assert part in text, f"{part!r} not in {text!r}"


def test_describe_of_plain_params_has_no_log_or_step() -> None:
    assert parse_one("interval(0.5, 1.0)").describe() == "float[0.5, 1]"
    assert parse_one("int(interval(2, 10))").describe() == "int[2, 10]"


# --- the shipped sweep ------------------------------------------------------------------------


def test_xgb_sweep_params() -> None:
    data = yaml.safe_load((REPO / "sweeps" / "xgb.yaml").read_text())
    space = parse_space(data["sweep"]["params"])
    assert space.params == {
        "max_depth": IntParam(2, 10),
        "learning_rate": FloatParam(0.01, 0.3, log=True),
        "n_estimators": IntParam(50, 300, step=50),
        "subsample": FloatParam(0.5, 1.0),
        "colsample_bytree": FloatParam(0.5, 1.0),
        "min_child_weight": FloatParam(0.5, 10.0, log=True),
        "gamma": FloatParam(0.0, 5.0),
        "reg_lambda": FloatParam(0.01, 10.0, log=True),
    }
    assert space.fixed() == {}
    assert set(space.distributions()) == set(space.params)
    assert all(SearchSpace.config_key(n).startswith("job.hyperparameters.") for n in space.params)
