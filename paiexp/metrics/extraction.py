"""Metric extraction: ``metric_definitions`` regexes over log lines, and output-parameter files.

Every match of a definition is kept as one step of a series (step = match index); the last
match is the metric's final value.  A job may also write ``output_parameters/<name>`` files
holding one number each; such a file gives the final value of ``<name>`` and wins over the log.
"""

from __future__ import annotations

import difflib
import math
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

METRIC_NAME = re.compile(r"^[A-Za-z0-9_\-./ ]+$")
SCANNED_LINES = 10_000  # of a log's end, searched for the line closest to a metric's regex
CLOSE_ENOUGH = 0.4  # the similarity (0-1) below which no line is said to look like one


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


def unmatched_metrics(
    definitions: Sequence[MetricDefinition], found: Mapping[str, float], log: Path
) -> list[str]:
    """One warning per metric that no log line matched (nor the platform gave): its regex,
    and the line of the log that looks most like what it expects."""
    missing = [d for d in definitions if d.name not in found]
    if not missing:
        return []
    lines: deque[str] = deque(maxlen=SCANNED_LINES)
    if log.is_file():
        with log.open(encoding="utf-8", errors="replace") as stream:
            lines.extend(line.strip() for line in stream if line.strip())
    warnings = []
    for definition in missing:
        closest = _closest_line(definition.regex, lines)
        like = f"closest line: {closest!r}" if closest else "no line looks like it"
        warnings.append(
            f"metric {definition.name!r} never matched regex {definition.regex!r}; {like}"
        )
    return warnings


def _closest_line(regex: str, lines: Iterable[str]) -> str | None:
    """The line most like the text ``regex`` expects (its capture group and escapes gone)."""
    expected = re.sub(r"\\(.)", r"\1", re.sub(r"\((?!\?).*\)", "", regex)).lower()
    matcher = difflib.SequenceMatcher(b=expected, autojunk=False)
    best, best_ratio = None, CLOSE_ENOUGH
    for line in lines:
        matcher.set_seq1(line.lower()[: 4 * len(expected) + 40])
        if matcher.real_quick_ratio() > best_ratio and matcher.ratio() > best_ratio:
            best, best_ratio = line, matcher.ratio()
    return best
