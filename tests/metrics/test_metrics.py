"""Unit tests of paiexp.metrics.extraction: log regexes and output-parameter files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from paiexp.metrics.extraction import (
    MetricDefinition,
    MetricExtractor,
    definition_error,
    read_output_parameters,
)

REPO = Path(__file__).resolve().parents[2]
LOGLOSS = "validation-logloss"
AUC = "test-auc"
LOGLOSS_VALUES = [0.60, 0.52, 0.47, 0.43]


def xgb_definitions() -> list[MetricDefinition]:
    """The metric definitions of the bundled XGBoost job, exactly as conf/job/xgb.yaml has them."""
    job = yaml.safe_load((REPO / "conf" / "job" / "xgb.yaml").read_text())
    return [MetricDefinition(**item) for item in job["metric_definitions"]]


def xgb_log() -> list[str]:
    return [
        "[paiexp] requirements already satisfied: xgboost",
        *(f"[{i}]\tvalidation-logloss:{value:.2f}" for i, value in enumerate(LOGLOSS_VALUES)),
        "some unrelated line: 12.5",
        "test-auc=0.987",
        "",
    ]


def values(extractor: MetricExtractor, name: str) -> list[float]:
    return [point.value for point in extractor.series[name]]


def steps(extractor: MetricExtractor, name: str) -> list[int]:
    return [point.step for point in extractor.series[name]]


# -- MetricExtractor ---------------------------------------------------------------------------


def test_xgb_definitions_are_valid() -> None:
    definitions = xgb_definitions()
    assert [d.name for d in definitions] == [LOGLOSS, AUC]
    assert all(definition_error(d) is None for d in definitions)


def test_extractor_series_over_xgb_log() -> None:
    extractor = MetricExtractor(xgb_definitions())
    extractor.feed(xgb_log(), timestamp=100.0)
    assert values(extractor, LOGLOSS) == LOGLOSS_VALUES
    assert steps(extractor, LOGLOSS) == list(range(len(LOGLOSS_VALUES)))
    assert values(extractor, AUC) == [0.987]
    assert steps(extractor, AUC) == [0]
    assert {p.timestamp for points in extractor.series.values() for p in points} == {100.0}
    assert {p.name for p in extractor.series[LOGLOSS]} == {LOGLOSS}


def test_extractor_final_gives_last_values() -> None:
    extractor = MetricExtractor(xgb_definitions())
    extractor.feed(xgb_log())
    assert extractor.final() == {LOGLOSS: LOGLOSS_VALUES[-1], AUC: 0.987}


def test_extractor_ignores_lines_that_do_not_match() -> None:
    extractor = MetricExtractor(xgb_definitions())
    lines = [
        "validation-logloss:0.5",  # no [step] prefix: the regex is anchored
        "x [0]\tvalidation-logloss:0.5",
        "[0]\ttrain-logloss:0.5",
        "test-auc 0.9",
        "nothing here",
    ]
    assert extractor.feed(lines) == []
    assert extractor.final() == {}
    assert extractor.series == {LOGLOSS: [], AUC: []}


def test_extractor_final_omits_metrics_that_never_matched() -> None:
    extractor = MetricExtractor(xgb_definitions())
    extractor.feed(["[0]\tvalidation-logloss:0.5"])
    assert extractor.final() == {LOGLOSS: 0.5}


def test_feed_returns_only_new_points() -> None:
    extractor = MetricExtractor(xgb_definitions())
    log = xgb_log()
    first = extractor.feed(log[:3], timestamp=1.0)
    assert [(p.name, p.value, p.step) for p in first] == [(LOGLOSS, 0.60, 0), (LOGLOSS, 0.52, 1)]
    second = extractor.feed(log[3:], timestamp=2.0)
    assert [(p.name, p.value, p.step, p.timestamp) for p in second] == [
        (LOGLOSS, 0.47, 2, 2.0),
        (LOGLOSS, 0.43, 3, 2.0),
        (AUC, 0.987, 0, 2.0),
    ]
    assert extractor.feed(["unrelated"]) == []
    assert len(extractor.series[LOGLOSS]) == len(LOGLOSS_VALUES)


def test_regex_matching_twice_on_one_line_gives_two_points() -> None:
    extractor = MetricExtractor(xgb_definitions())
    added = extractor.feed(["test-auc=0.91 then test-auc=0.95"])
    assert [(p.value, p.step) for p in added] == [(0.91, 0), (0.95, 1)]
    assert extractor.final() == {AUC: 0.95}


def test_non_numeric_captures_are_skipped() -> None:
    extractor = MetricExtractor(xgb_definitions())
    added = extractor.feed(["test-auc=-", "test-auc=e", "test-auc=1.2.3", "test-auc=0.5"])
    assert [(p.value, p.step) for p in added] == [(0.5, 0)]


def test_overflowing_numbers_are_skipped() -> None:
    extractor = MetricExtractor(xgb_definitions())
    assert extractor.feed(["test-auc=1e999"]) == []
    assert extractor.final() == {}


def test_scientific_notation_is_read() -> None:
    extractor = MetricExtractor(xgb_definitions())
    extractor.feed(["[0]\tvalidation-logloss:1.5e-03", "test-auc=+9.9E-1"])
    assert extractor.final() == {LOGLOSS: 0.0015, AUC: 0.99}


def test_two_definitions_can_match_one_line() -> None:
    definitions = [MetricDefinition("a", r"a=(\d+)"), MetricDefinition("b", r"b=(\d+)")]
    extractor = MetricExtractor(definitions)
    added = extractor.feed(["a=1 b=2"])
    assert [(p.name, p.value) for p in added] == [("a", 1.0), ("b", 2.0)]


# -- definition_error --------------------------------------------------------------------------


def test_definition_error_none_for_valid_definition() -> None:
    assert definition_error(MetricDefinition("loss", r"loss=([0-9.]+)")) is None


@pytest.mark.parametrize("regex", [r"loss=\d+", r"(a)=(b)"], ids=["zero-groups", "two-groups"])
def test_definition_error_needs_exactly_one_group(regex: str) -> None:
    error = definition_error(MetricDefinition("m", regex))
    assert error is not None
    assert "exactly one" in error
    assert repr(regex) in error


def test_definition_error_uncompilable_regex() -> None:
    error = definition_error(MetricDefinition("m", "("))
    assert error is not None
    assert "'('" in error
    assert "compile" in error


@pytest.mark.parametrize("name", ["a:b", "", "a=b", "a\tb"])
def test_definition_error_bad_name(name: str) -> None:
    error = definition_error(MetricDefinition(name, r"x=(\d+)"))
    assert error is not None
    assert repr(name) in error


@pytest.mark.parametrize("name", ["loss", "validation-logloss", "a/b.c_d", "test auc"])
def test_definition_error_good_names(name: str) -> None:
    assert definition_error(MetricDefinition(name, r"x=(\d+)")) is None


# -- output parameters -------------------------------------------------------------------------


def test_read_output_parameters(tmp_path: Path) -> None:
    (tmp_path / "auc").write_text("0.9\n")
    (tmp_path / "bad").write_text("x")
    (tmp_path / "rmse").write_text(" 1.5 ")
    assert read_output_parameters(tmp_path) == {"auc": 0.9, "rmse": 1.5}


def test_read_output_parameters_skips_subdirectories(tmp_path: Path) -> None:
    (tmp_path / "auc").write_text("0.9")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "loss").write_text("0.1")
    assert read_output_parameters(tmp_path) == {"auc": 0.9}


def test_read_output_parameters_missing_directory(tmp_path: Path) -> None:
    assert read_output_parameters(tmp_path / "nowhere") == {}


def test_read_output_parameters_empty_directory(tmp_path: Path) -> None:
    assert read_output_parameters(tmp_path) == {}
