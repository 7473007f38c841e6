"""Metric extraction: ``metric_definitions`` regexes over log lines, and output-parameter files.

Every match of a definition is kept as one step of a series (step = match index); the last
match is the metric's final value.  A job may also write ``output_parameters/<name>`` files
holding one number each; such a file gives the final value of ``<name>`` and wins over the log.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

METRIC_NAME = re.compile(r"^[A-Za-z0-9_\-./ ]+$")


@dataclass
class MetricDefinition:
    """A metric read from the job's log: ``regex`` has exactly one capture group."""

    name: str
    regex: str


@dataclass(frozen=True)
class MetricPoint:
    name: str
    value: float
    step: int
    timestamp: float


def definition_error(definition: MetricDefinition) -> str | None:
    """Why a definition is unusable, or None when it is fine."""
    if not METRIC_NAME.match(definition.name):
        return (
            f"metric name {definition.name!r} may hold only letters, digits, "
            "'_', '-', '.', '/' and spaces"
        )
    try:
        pattern = re.compile(definition.regex)
    except re.error as exc:
        return f"regex {definition.regex!r} does not compile: {exc}"
    if pattern.groups != 1:
        return (
            f"regex {definition.regex!r} has {pattern.groups} capture groups; "
            "it needs exactly one, around the number"
        )
    return None


class MetricExtractor:
    """Feeds log lines through the definitions and keeps each metric's step series."""

    def __init__(self, definitions: Sequence[MetricDefinition]) -> None:
        self._patterns = [(d.name, re.compile(d.regex)) for d in definitions]
        self.series: dict[str, list[MetricPoint]] = {d.name: [] for d in definitions}

    def feed(self, lines: Iterable[str], timestamp: float | None = None) -> list[MetricPoint]:
        """Extract from new lines; returns the points they added, in order."""
        now = time.time() if timestamp is None else timestamp
        added: list[MetricPoint] = []
        for line in lines:
            for name, pattern in self._patterns:
                for match in pattern.finditer(line):
                    value = _to_float(match.group(1))
                    if value is None:
                        continue
                    series = self.series[name]
                    point = MetricPoint(name, value, len(series), now)
                    series.append(point)
                    added.append(point)
        return added

    def final(self) -> dict[str, float]:
        """The last value of every metric that matched at least once."""
        return {name: points[-1].value for name, points in self.series.items() if points}


def read_output_parameters(directory: Path) -> dict[str, float]:
    """Numbers a job wrote as ``output_parameters/<name>`` files (non-numbers are skipped)."""
    if not directory.is_dir():
        return {}
    values: dict[str, float] = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and METRIC_NAME.match(path.name):
            value = _to_float(path.read_text(errors="replace").strip())
            if value is not None:
                values[path.name] = value
    return values


def _to_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if not math.isinf(value) else None
