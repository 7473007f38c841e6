"""``-m/--multirun``: Hydra's sweep overrides run as a grid sweep, tracked like any sweep.

As with Hydra's basic sweeper, each sweep override (``key=a,b,c``, ``key=choice(a,b)``,
``key=range(1,4)``) is one dimension and every combination is one trial, the last key varying
fastest; Hydra's own override parser reads them.  The trials run as a study with the
bruteforce sampler, its points queued in that order: one parent run, one child run per point.

Keys are ``job.*`` and ``backend.*`` keys (``job.hyperparameters.max_depth`` becomes the
parameter ``max_depth``); config groups (``backend=local,docker``) cannot vary between one
sweep's trials.  Without ``+sweep=NAME`` the sweep minimizes the job's first metric unless
``sweep.objective`` says otherwise; with one, that sweep's settings apply and the grid
replaces its ``params``.  Each launch is a new study unless ``sweep.study_name`` is set.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from paiexp.errors import UserError
from paiexp.sweep.space import SWEPT_PREFIXES, Scalar

HYPERPARAMETERS = "job.hyperparameters."


@dataclass(frozen=True)
class Grid:
    """The sweep's dimensions (parameter name -> values), in command-line order."""

    params: dict[str, list[Scalar]]

    def points(self) -> list[dict[str, Scalar]]:
        """Every combination, in Hydra's order: the last dimension varies fastest."""
        names = list(self.params)
        product = itertools.product(*self.params.values())
        return [dict(zip(names, values, strict=True)) for values in product]


def split_multirun(overrides: Sequence[str]) -> tuple[list[str], Grid]:
    """(the plain overrides, the grid of the sweep overrides); a UserError for a sweep over
    anything but a value, or for no sweep at all."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    GRID_TYPES = (ValueType.SIMPLE_CHOICE_SWEEP, ValueType.CHOICE_SWEEP, ValueType.RANGE_SWEEP)
    plain: list[str] = []
    params: dict[str, list[Scalar]] = {}
    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except HydraException:
            plain.append(text)  # compose reports it, as for a single run
            continue
        if not override.is_sweep_override():
            plain.append(text)
            continue
        key = override.get_key_element().lstrip("+~")
        if override.is_delete() or not key.startswith(SWEPT_PREFIXES):
            why = "a config group" if "." not in key else "only job and backend settings"
            raise UserError(
                f"{text}: -m sweeps values of job.* and backend.* keys; {key} is not one "
                f"({why} cannot change between one sweep's trials)"
            )
        if override.value_type not in GRID_TYPES:
            raise UserError(
                f"{text}: -m runs a grid of listed values (a,b,c, choice(...) or range(...)); "
                "an interval is searched by a sweep in sweeps/NAME.yaml (+sweep=NAME)"
            )
        name = key.removeprefix(HYPERPARAMETERS)
        params.pop(name, None)  # given twice: the last wins, as in Hydra
        params[name] = [_scalar(text, value) for value in override.sweep_iterator()]
    if not params:
        raise UserError(
            "-m: no sweep override; give KEY=a,b,c or KEY=range(a,b) (without -m, paiexp "
            "runs one job)"
        )
    return plain, Grid(params)


def apply_grid(cfg: DictConfig, grid: Grid) -> None:
    """Make ``cfg.sweep`` the grid's sweep: its params, the bruteforce sampler, one trial
    per point (queued in order), a new study unless named, and an objective."""
    sweep = cfg.sweep
    points = grid.points()
    sweep.params = {
        name: {"type": "categorical", "choices": values} for name, values in grid.params.items()
    }
    sweep.sampler.name = "bruteforce"
    sweep.sampler.options = {}  # another sampler's options (a sweep file's tpe) do not fit
    sweep.n_trials = len(points)
    sweep.enqueue = points
    if sweep.study_name is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        sweep.study_name = f"{sweep.name}-{stamp}-{secrets.token_hex(2)}"
    if OmegaConf.is_missing(sweep, "objective"):
        sweep.objective = {"metric": _first_metric(cfg), "direction": "minimize"}


def _first_metric(cfg: DictConfig) -> str:
    definitions: Any = OmegaConf.select(cfg, "job.metric_definitions") or []
    if definitions:
        return str(definitions[0].name)
    scalars: Any = OmegaConf.select(cfg, "job.tensorboard.metrics") or []
    if scalars:
        first = scalars[0]
        return str(first if isinstance(first, str) else first.name)
    raise UserError(
        "sweep.objective: -m ranks its trials by a metric, and the job declares none "
        "(job.metric_definitions, job.tensorboard.metrics); add one, or set "
        "sweep.objective={metric: NAME, direction: maximize}"
    )


def _scalar(text: str, value: Any) -> Scalar:
    if isinstance(value, float):
        return round(value, 12)  # range(0, 1, 0.1): 0.3, not 0.30000000000000004
    if isinstance(value, str | int | bool) or value is None:
        return value
    raise UserError(f"{text}: -m sweeps over single values; {value!r} is not one")
