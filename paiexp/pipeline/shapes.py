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
from typing import Any

from paiexp.errors import UserError
from paiexp.pipeline.condition import Reference
from paiexp.sweep.space import SWEPT_PREFIXES

PLACEHOLDER_ID = "0" * 32


Shape = dict[str, Any]


def job_shape(
    job_name: str,
    metrics: Iterable[str],
    output_parameters: Iterable[str],
    channels: Iterable[str],
    hyperparameters: Mapping[str, Any],
    output_uri: str,
) -> Shape:
    """``metrics``: the metrics the job declares; ``output_parameters``: the names it says
    it writes to ``output_parameters/`` (metrics too, once it ran)."""
    written = dict.fromkeys(output_parameters, 0.0)
    return {
        "status": "succeeded",
        "job_name": job_name,
        "run_id": PLACEHOLDER_ID,
        "metrics": {**dict.fromkeys(metrics, 0.0), **written},
        "output_parameters": written,
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
        if not isinstance(node, dict):
            raise UserError(f"{key}: {reference}: {where} is a single value, it has no {part!r}")
        if part not in node:
            has = ", ".join(sorted(node)) or "nothing"
            raise UserError(
                f"{key}: {reference}: {where} has no {part!r}; it has: {has}{_hint(where)}"
            )
        node = node[part]
        where = f"{where}.{part}"


def _hint(where: str) -> str:
    """Where a job step's metrics and output parameters come from."""
    if where.endswith((".metrics", ".output_parameters")):
        return (
            " (its job's metric_definitions, tensorboard.metrics, mlflow_metrics and "
            "output_parameters)"
        )
    return ""
