"""What a step's results hold, known before it runs: each reference to them is checked
against it (the message lists what exists), and placeholders of it stand in for the values
while later steps are checked, before anything runs.

A job step's results: ``status``, ``job_name``, ``run_id``, ``metrics`` (the job's metric
definitions and output parameters), ``output_parameters``, ``outputs`` (channel -> URI) and
``params`` (its hyperparameters).  A sweep step's: ``status``, ``run_id`` (its sweep's parent
run), ``study_name``, ``n_complete`` and, for one objective, ``best``: ``params`` (the best
trial's hyperparameters, ready for ``job.hyperparameters``), ``value``, ``values`` (objective
-> value), ``trial``, ``job_name``, ``run_id``, ``outputs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from paiexp.errors import UserError
from paiexp.pipeline.condition import Reference
from paiexp.sweep.space import SWEPT_PREFIXES

PLACEHOLDER_ID = "0" * 32


@dataclass(frozen=True)
class Dynamic:
    """A mapping whose names are known only once the step ran (the metrics it reported)."""

    known: tuple[str, ...] = ()
    placeholder: Any = 0.0


Shape = dict[str, Any]


def job_shape(
    job_name: str,
    metrics: Iterable[str],
    channels: Iterable[str],
    hyperparameters: Mapping[str, Any],
    output_uri: str,
) -> Shape:
    return {
        "status": "succeeded",
        "job_name": job_name,
        "run_id": PLACEHOLDER_ID,
        "metrics": Dynamic(tuple(metrics)),
        "output_parameters": Dynamic(),
        "outputs": {channel: output_uri for channel in channels},
        "params": dict(hyperparameters),
    }


def sweep_shape(
    study_name: str,
    objectives: list[str],
    point: Mapping[str, Any],
    channels: Iterable[str],
    output_uri: str,
) -> Shape:
    shape: Shape = {
        "status": "succeeded",
        "run_id": PLACEHOLDER_ID,
        "study_name": study_name,
        "n_complete": 1,
    }
    if len(objectives) == 1:  # a multi-objective sweep has a Pareto front, not one best
        shape["best"] = {
            "params": best_params(point),
            "value": 0.0,
            "values": {metric: 0.0 for metric in objectives},
            "trial": 0,
            "job_name": f"{study_name}-trial",
            "run_id": PLACEHOLDER_ID,
            "outputs": {channel: output_uri for channel in channels},
        }
    return shape


def best_params(values: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's hyperparameters (swept and fixed) as ``job.hyperparameters`` nests them:
    ``train.lr`` -> ``{train: {lr: ...}}``; swept ``job.*``/``backend.*`` keys are left out."""
    tree: dict[str, Any] = {}
    for name, value in values.items():
        if name.startswith(SWEPT_PREFIXES):
            continue
        *parents, leaf = name.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def check_reference(reference: Reference, shape: Shape, key: str) -> None:
    """A UserError unless the step's results hold what the reference names (the message
    lists what they hold)."""
    node: Any = shape
    where = f"steps.{reference.step}"
    for part in reference.path:
        if isinstance(node, Dynamic):
            node = node.placeholder
        elif not isinstance(node, dict):
            raise UserError(f"{key}: {reference}: {where} is a single value, it has no {part!r}")
        elif part not in node:
            has = ", ".join(sorted(node)) or "nothing"
            raise UserError(f"{key}: {reference}: {where} has no {part!r}; it has: {has}")
        else:
            node = node[part]
        where = f"{where}.{part}"


def placeholders(shape: Shape, references: Iterable[Reference]) -> dict[str, Any]:
    """Results of the shape, each dynamic mapping holding the names referenced in it."""
    paths = [r.path for r in references]

    def fill(node: Any, at: tuple[str, ...]) -> Any:
        if isinstance(node, Dynamic):
            names = {p[len(at)] for p in paths if p[: len(at)] == at and len(p) > len(at)}
            return {name: node.placeholder for name in (*node.known, *sorted(names))}
        if isinstance(node, dict):
            return {name: fill(value, (*at, name)) for name, value in node.items()}
        return node

    result = fill(shape, ())
    assert isinstance(result, dict)
    return result
