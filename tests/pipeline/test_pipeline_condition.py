"""The ``when:`` language: what it accepts, what it refuses (one line, before anything runs),
and how it evaluates over steps' results, without Python's eval."""

from __future__ import annotations

import re

import pytest

from paiexp.errors import UserError
from paiexp.pipeline.condition import ConditionError, Reference, parse_condition

RESULTS = {
    "train": {
        "status": "succeeded",
        "metrics": {"test-accuracy": 0.93, "loss": 0.2},
        "outputs": {"model": "file:///tmp/model"},
    },
    "search": {"best": {"value": 0.99, "params": {"max_depth": 4}}},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('steps.train.metrics["test-accuracy"] <= 0.90', False),
        ('steps.train.metrics["test-accuracy"] > 0.90', True),
        ("steps.train.metrics.loss < 0.5 and steps.search.best.value >= 0.99", True),
        ('steps.train.status == "failed" or steps.search.best.params.max_depth == 4', True),
        ('not steps.train.status != "succeeded"', True),
        ("0.9 < steps.train.metrics['test-accuracy'] <= 0.95", True),
        ("0.95 < steps.train.metrics['test-accuracy'] <= 1", False),
        ("steps.train.metrics.loss > -1", True),
        ("(steps.train.metrics.loss < 0.1 or true) and not false", True),
        ('steps.train.outputs.model == "file:///tmp/model"', True),
    ],
)
def test_conditions_evaluate(text: str, expected: bool) -> None:
    value, seen = parse_condition(text, "when").evaluate(RESULTS)
    assert value is expected
    assert seen  # every condition above reads at least one result


def test_values_seen_are_the_ones_read() -> None:
    condition = parse_condition(
        'steps.train.metrics["test-accuracy"] > 0.99 and steps.search.best.value > 0', "when"
    )
    assert condition.references == (
        Reference("train", ("metrics", "test-accuracy")),
        Reference("search", ("best", "value")),
    )
    value, seen = condition.evaluate(RESULTS)
    assert value is False
    assert seen == {'steps.train.metrics["test-accuracy"]': 0.93}  # `and` stopped there


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        ('steps.train.metrics["x"] >', "cannot parse"),
        ('__import__("os").system("true")', "function call"),
        ("steps.train.metrics.loss + 1 > 2", "arithmetic"),
        ("x == 1", "'x' is not a reference"),
        ("steps.train == 1", "name one of its results"),
        ("1 in steps.train.metrics", "operator not allowed"),
        ("(lambda: True)()", "function call"),
        ("[1, 2] == steps.train.status", "a list"),
        ("steps.train.metrics[0] == 1", "not a reference"),
    ],
)
def test_malformed_conditions_are_one_line_errors(text: str, mentions: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_condition(text, "pipeline.steps.b.when")
    message = str(caught.value)
    assert message.startswith("pipeline.steps.b.when: ") and "\n" not in message
    assert mentions in message


def test_attributes_are_keys_of_the_results_never_python_attributes() -> None:
    condition = parse_condition("steps.train.metrics.__class__ == 1", "when")
    assert condition.references == (Reference("train", ("metrics", "__class__")),)
    with pytest.raises(ConditionError, match="has no '__class__'"):
        condition.evaluate(RESULTS)


def test_what_cannot_be_evaluated_says_what_there_is() -> None:
    missing = parse_condition('steps.train.metrics["auc"] > 0.9', "when")
    with pytest.raises(ConditionError, match=r"has no 'auc'; it has: loss, test-accuracy"):
        missing.evaluate(RESULTS)
    mixed = parse_condition("steps.train.status > 0.5", "when")
    with pytest.raises(ConditionError, match=re.escape("cannot compare 'succeeded' > 0.5")):
        mixed.evaluate(RESULTS)
