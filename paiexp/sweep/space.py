"""The search space: ``sweep.params`` parsed into typed parameters, then Optuna distributions.

Two spellings of each parameter are accepted:

- structured: ``{type: float, low: 0.01, high: 0.3, log: true}``, ``{type: int, low, high,
  step}``, ``{type: categorical, choices: [...]}``;
- the hydra-optuna-sweeper strings users paste: ``interval(a, b)``, ``int(interval(a, b))``,
  ``tag(log, interval(a, b))``, ``range(a, b[, step])``, ``choice(x, y, ...)``.

``range(a, b, step)`` means what Python's and Hydra's ``range`` mean: ``b`` is excluded, so
``range(1, 10)`` is 1..9 and ``range(0, 1, 0.25)`` is 0, 0.25, 0.5, 0.75. (The
hydra-optuna-sweeper plugin includes ``b``; a range pasted from it loses its top value.)
Any other value (a number, a plain string) is a fixed parameter: set on every trial.

Names map to config keys: ``max_depth`` is ``job.hyperparameters.max_depth``; names that start
with ``job.`` or ``backend.`` are those keys (``job.instance_type`` may be swept too).
Parsing needs no Optuna; :meth:`SearchSpace.distributions` builds Optuna's objects.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paiexp.errors import UserError

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class FloatParam:
    low: float
    high: float
    log: bool = False
    step: float | None = None

    def describe(self) -> str:
        extra = " log" if self.log else f" step {self.step:g}" if self.step else ""
        return f"float[{self.low:g}, {self.high:g}]{extra}"


@dataclass(frozen=True)
class IntParam:
    low: int
    high: int
    log: bool = False
    step: int = 1

    def describe(self) -> str:
        extra = " log" if self.log else f" step {self.step}" if self.step != 1 else ""
        return f"int[{self.low}, {self.high}]{extra}"


@dataclass(frozen=True)
class CategoricalParam:
    choices: tuple[Scalar, ...]

    def describe(self) -> str:
        return "choice(" + ", ".join(map(str, self.choices)) + ")"


@dataclass(frozen=True)
class FixedParam:
    value: Scalar

    def describe(self) -> str:
        return f"fixed {self.value}"


Param = FloatParam | IntParam | CategoricalParam | FixedParam
SWEPT_PREFIXES = ("job.", "backend.")
STRUCTURED_KEYS = {"type", "low", "high", "log", "step", "choices"}


@dataclass(frozen=True)
class SearchSpace:
    params: dict[str, Param]

    @staticmethod
    def config_key(name: str) -> str:
        """The config key a parameter sets."""
        if name.startswith(SWEPT_PREFIXES):
            return name
        # a define-by-run parameter may be named as a Hydra addition (``+w``): its value's key
        return f"job.hyperparameters.{name.lstrip('+')}"

    def fixed(self) -> dict[str, Scalar]:
        return {n: p.value for n, p in self.params.items() if isinstance(p, FixedParam)}

    def distributions(self) -> dict[str, Any]:
        """Optuna distributions of the sampled (non-fixed) parameters."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        result: dict[str, Any] = {}
        for name, param in self.params.items():
            if isinstance(param, FloatParam):
                result[name] = FloatDistribution(
                    param.low, param.high, log=param.log, step=param.step
                )
            elif isinstance(param, IntParam):
                result[name] = IntDistribution(
                    param.low, param.high, log=param.log, step=param.step
                )
            elif isinstance(param, CategoricalParam):
                result[name] = CategoricalDistribution(param.choices)
        return result

    def first_point(self) -> dict[str, Scalar]:
        """One value of every parameter (its low end or first choice), to validate with."""
        point: dict[str, Scalar] = {}
        for name, param in self.params.items():
            if isinstance(param, FloatParam | IntParam):
                point[name] = param.low
            elif isinstance(param, CategoricalParam):
                point[name] = param.choices[0]
            else:
                point[name] = param.value
        return point


def written(value: Any) -> Any:
    """A parameter as ``sweep.params`` writes it: an Optuna distribution (the Python API's
    ``space=``) in the structured spelling, anything else as given (checked by
    :func:`parse_space`)."""
    kind = type(value).__name__
    if not type(value).__module__.startswith("optuna."):
        return value
    if kind == "CategoricalDistribution":
        return {"type": "categorical", "choices": list(value.choices)}
    if kind in ("FloatDistribution", "IntDistribution"):
        spec = {"type": kind.removesuffix("Distribution").lower(), "low": value.low}
        spec.update(high=value.high, log=value.log)
        if value.step is not None:
            spec["step"] = value.step
        return spec
    return value


def parse_space(params: Mapping[str, Any]) -> SearchSpace:
    """Parse ``sweep.params``; a bad entry is a UserError naming ``sweep.params.NAME``.

    A mapping without any structured key (type, low, high, ...) nests names:
    ``{job: {instance_type: ...}}`` is the parameter ``job.instance_type`` (what Hydra makes
    of ``+sweep.params.job.instance_type=...``).
    """
    parsed: dict[str, Param] = {}
    for name, value in _flatten(params).items():
        key = f"sweep.params.{name}"
        if isinstance(value, Mapping):
            parsed[name] = _structured(key, value)
        elif isinstance(value, str):
            parsed[name] = _from_string(key, value)
        elif isinstance(value, list | tuple):
            raise UserError(
                f"{key}: a list is ambiguous; write choice(a, b) or "
                "{type: categorical, choices: [a, b]}"
            )
        else:
            parsed[name] = FixedParam(value)
    if not any(not isinstance(p, FixedParam) for p in parsed.values()):
        raise UserError(
            "sweep.params: nothing to search; give at least one range, interval or choice"
        )
    return SearchSpace(parsed)


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping) and not STRUCTURED_KEYS & set(value):
            flat.update(_flatten(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _structured(key: str, spec: Mapping[str, Any]) -> Param:
    kind = spec.get("type")
    allowed = {
        "float": {"low", "high", "log", "step"},
        "int": {"low", "high", "log", "step"},
        "categorical": {"choices"},
    }
    if kind not in allowed:
        raise UserError(f"{key}.type: invalid value {kind!r}; expected float, int or categorical")
    unknown = set(spec) - allowed[kind] - {"type"}
    if unknown:
        raise UserError(
            f"{key}: unknown key {sorted(unknown)[0]!r} for type {kind}; valid: "
            + ", ".join(sorted(allowed[kind]))
        )
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list | tuple) or not choices:
            raise UserError(f"{key}.choices: needs a non-empty list")
        return CategoricalParam(tuple(choices))
    for bound in ("low", "high"):
        if not isinstance(spec.get(bound), int | float) or isinstance(spec.get(bound), bool):
            raise UserError(f"{key}.{bound}: needs a number")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise UserError(f"{key}.log: invalid value {log!r}; expected true or false")
    return _numeric(key, kind, spec["low"], spec["high"], log, spec.get("step"))


def _numeric(key: str, kind: str, low: Any, high: Any, log: bool, step: Any) -> Param:
    if low > high:
        raise UserError(f"{key}: low ({low}) is above high ({high})")
    if log and low <= 0:
        raise UserError(f"{key}: a log scale needs low > 0, got {low}")
    if log and step is not None and step != 1:
        raise UserError(f"{key}: log and step cannot be combined")
    if step is not None and step <= 0:
        raise UserError(f"{key}.step: needs a number > 0, got {step}")
    if kind == "int":
        if not all(float(v).is_integer() for v in (low, high, step or 1)):
            raise UserError(f"{key}: an int parameter needs whole-number low, high and step")
        return IntParam(int(low), int(high), log=log, step=int(step or 1))
    return FloatParam(
        float(low), float(high), log=log, step=float(step) if step is not None else None
    )


def _from_string(key: str, text: str) -> Param:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException, OverrideParseException

    try:
        override = OverridesParser.create().parse_override(f"param={text}")
    except OverrideParseException as exc:
        if re.match(r"^\s*(tag|int|float|interval|range|choice|shuffle)\s*\(", text):
            raise UserError(f"{key}: cannot parse {text!r}: {_one_line(exc)}") from None
        return FixedParam(text)  # a plain string value
    except HydraException as exc:  # e.g. interval(0.1): a sweep function's arguments
        raise UserError(f"{key}: {text!r}: {_one_line(exc)}") from None
    sweep = override.value()
    if isinstance(sweep, ChoiceSweep):
        return CategoricalParam(tuple(_scalar(key, choice) for choice in sweep.list))
    if isinstance(sweep, IntervalSweep):
        kind = "int" if isinstance(sweep.start, int) and isinstance(sweep.end, int) else "float"
        return _numeric(key, kind, sweep.start, sweep.end, "log" in sweep.tags, None)
    if isinstance(sweep, RangeSweep):
        return _range(key, sweep)
    return FixedParam(_scalar(key, sweep))


def _scalar(key: str, value: Any) -> Scalar:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if type(value).__name__ == "QuotedString":
        return str(value.text)
    raise UserError(f"{key}: {value!r} is not a scalar, a range, an interval or a choice")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _range(key: str, sweep: Any) -> Param:
    start, stop, step = sweep.start, sweep.stop, sweep.step
    if sweep.shuffle:
        raise UserError(f"{key}: shuffle(range(...)) has no meaning for a sampler; drop shuffle")
    if step <= 0:
        raise UserError(f"{key}: range step must be > 0, got {step}")
    # Python's range: stop excluded; the tolerance keeps float rounding from including it
    count = math.ceil((stop - start) / step - 1e-9)
    if count <= 0:
        raise UserError(f"{key}: range({start}, {stop}, {step}) is empty")
    last = start + (count - 1) * step
    is_int = all(isinstance(v, int) for v in (start, stop, step))
    kind = "int" if is_int else "float"
    return _numeric(key, kind, start, round(last, 12) if not is_int else last, False, step)
