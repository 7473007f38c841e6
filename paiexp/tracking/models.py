"""Models in MLflow: the model a job wrote as an MLflow 3 logged model, and the best trial's
model registered.

A job's model stays where the job wrote it (oss:// or file://): its logged model is an
external one (MLflow keeps only a stub MLmodel file), its URI in the ``paiexp.model_uri`` tag,
linked to its run as the run's output, with the run's params and its final metrics (logged
with the model's id, so the Models tab lists and sorts them).  Registering makes it a version
of a registered model carrying the study, trial and objective value; the alias ``best`` moves
to a version only when its objective value beats the one the current ``best`` carries.
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODEL_URI_TAG = "paiexp.model_uri"
BEST_ALIAS = "best"
STUDY_TAG = "paiexp.study"
TRIAL_TAG = "paiexp.trial"
VALUE_TAG = "paiexp.objective_value"
DIRECTION_TAG = "paiexp.direction"
METRIC_TAG = "paiexp.objective"
MODEL_ID_TAG = "paiexp.model_id"  # the SQL registry keeps no model_id of a version of a URI


def log_external_model(client: Any, experiment_id: str, run_id: str, model_uri: str) -> str:
    """The id of the logged model of ``run_id`` at ``model_uri`` (created once per run).

    Each step is done only if it is not done yet, the link to the run last: called again
    after it was cut short (the tracking server went away), it finishes that model."""
    from mlflow.entities import LoggedModelOutput, Metric

    run = client.get_run(run_id)
    model = _run_model(client, experiment_id, run_id)
    if model is None:
        model = new_external_model(
            client,
            experiment_id,
            run_id,
            name=run.data.tags.get("paiexp.job_name") or run.info.run_name,
            model_uri=model_uri,
            params=run.data.params,
        )
    linked = {output.model_id for output in run.outputs.model_outputs} if run.outputs else set()
    if model.model_id in linked:
        return str(model.model_id)
    _make_ready(client, model)
    final = [
        Metric(m.key, m.value, m.timestamp, m.step, model_id=model.model_id, run_id=run_id)
        for m in run.data._metric_objs
    ]
    if final:  # the same points again after a cut-short call: MLflow keeps them once
        client.log_batch(run_id, metrics=final)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    return str(model.model_id)


def new_external_model(
    client: Any,
    experiment_id: str,
    run_id: str,
    *,
    name: str,
    model_uri: str,
    params: Mapping[str, str],
) -> Any:
    """A new logged model of ``run_id`` kept at ``model_uri``, with the run's ``params``."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL

    return client.create_logged_model(
        experiment_id,
        name=name,
        source_run_id=run_id,
        tags={MLFLOW_MODEL_IS_EXTERNAL: "true", MODEL_URI_TAG: model_uri},
        params={k: v for k, v in params.items() if k != MODEL_URI_TAG},
    )


def link_final_metrics(metrics: list[Any], model_id: str, run_id: str) -> list[Any] | None:
    """``metrics``, a run's points (it may hold earlier ones, or equal ones, which MLflow
    keeps once), with each name's last point linked to the model: the point MLflow keeps as
    the run's metric (the greatest step, then timestamp, then value), as
    :func:`log_external_model` links them.  None if a value is not finite (MLflow stores
    those changed, so which is last is its to say)."""
    from mlflow.entities import Metric

    if not all(math.isfinite(m.value) for m in metrics):
        return None
    last: dict[str, Any] = {}
    for metric in metrics:
        held = last.get(metric.key)
        if held is None or (metric.step, metric.timestamp, metric.value) > (
            held.step,
            held.timestamp,
            held.value,
        ):
            last[metric.key] = metric
    final = {id(m) for m in last.values()}
    return [
        Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id, run_id=run_id)
        if id(m) in final
        else m
        for m in metrics
    ]


def complete_external_model(client: Any, model: Any, run_id: str) -> None:
    """A new logged model's MLmodel stub and READY status, then its link to the run."""
    from mlflow.entities import LoggedModelOutput

    _make_ready(client, model)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])


def _make_ready(client: Any, model: Any) -> None:
    """The MLmodel stub of an external model, and its status READY (unless it is)."""
    from mlflow.entities import LoggedModelStatus
    from mlflow.models.model import MLMODEL_FILE_NAME
    from mlflow.models.utils import get_external_mlflow_model_spec

    if model.status == LoggedModelStatus.READY:
        return
    with tempfile.TemporaryDirectory() as directory:
        get_external_mlflow_model_spec(model).save(f"{directory}/{MLMODEL_FILE_NAME}")
        client.log_model_artifacts(model.model_id, directory)
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)


def run_model(client: Any, experiment_id: str, run_id: str) -> str | None:
    """The id of the logged model a run produced (the oldest), if any."""
    model = _run_model(client, experiment_id, run_id)
    return None if model is None else str(model.model_id)


def _run_model(client: Any, experiment_id: str, run_id: str) -> Any:
    from paiexp.tracking.store_merge import JOB_MODEL_TAG

    found = client.search_logged_models(
        [experiment_id], filter_string=f"source_run_id = '{run_id}'", max_results=50
    )
    own = [m for m in found if JOB_MODEL_TAG not in m.tags]  # not one its script logged
    return min(own, key=lambda m: (m.creation_timestamp, m.model_id), default=None)


@dataclass(frozen=True)
class Candidate:
    """What a registered version records of the model it holds."""

    run_id: str
    model_id: str
    model_uri: str
    value: float | None = None
    direction: str = "minimize"
    study: str | None = None
    trial: int | None = None
    metric: str | None = None

    def tags(self) -> dict[str, str]:
        tags = {
            MODEL_ID_TAG: self.model_id,
            STUDY_TAG: self.study,
            TRIAL_TAG: None if self.trial is None else str(self.trial),
            VALUE_TAG: None if self.value is None else repr(self.value),
            DIRECTION_TAG: self.direction if self.value is not None else None,
            METRIC_TAG: self.metric,
        }
        return {k: v for k, v in tags.items() if v is not None}


def model_uri(client: Any, model_id: str) -> str:
    """Where a logged model's files are (its ``paiexp.model_uri`` tag)."""
    model = client.get_logged_model(model_id)
    return str(model.tags.get(MODEL_URI_TAG) or model.artifact_location)


@dataclass(frozen=True)
class Registered:
    version: str
    new: bool  # a version created now (not one registered before)
    best_version: str  # the version the alias ``best`` points at

    @property
    def best(self) -> bool:
        return self.best_version == self.version


def register(client: Any, name: str, candidate: Candidate) -> Registered:
    """Make ``candidate``'s model a version of the registered model ``name`` (once per logged
    model), and move ``best`` to it when it improves on the current ``best`` version."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version, new = _version(client, name, candidate)
    current = _best(client, name)
    held = None if current is None else str(current.version)
    moves = held is None or held == version or _improves(candidate, current)
    if moves and held != version:
        client.set_registered_model_alias(name, BEST_ALIAS, version)
    return Registered(version=version, new=new, best_version=version if moves else str(held))


def run_candidate(client: Any, run_id: str) -> Candidate:
    """What registering a run's model records: its logged model (made now from its
    ``paiexp.model_uri`` tag if it has none, e.g. a run older than logged models) and, for a
    sweep's trial, the study, trial number and objective value its parent run names."""
    from paiexp.errors import UserError

    run = client.get_run(run_id)
    experiment_id = run.info.experiment_id
    model_id = run_model(client, experiment_id, run_id)
    if model_id is None:
        uri = run.data.tags.get(MODEL_URI_TAG)
        empty = run.data.tags.get("paiexp.model_empty") == "true"
        if uri is None or empty or run.info.status != "FINISHED":
            raise UserError(f"run_id: run {run_id} is no finished run with a model to register")
        model_id = log_external_model(client, experiment_id, run_id, uri)
    candidate = Candidate(run_id, model_id, model_uri(client, model_id))
    parent_id = run.data.tags.get("mlflow.parentRunId")
    if parent_id is None:
        return candidate
    parent = client.get_run(parent_id).data.params
    objective = re.fullmatch(r"(\S+) \((minimize|maximize)\)", parent.get("sweep.objective", ""))
    trial = run.data.tags.get("paiexp.trial_number")
    if objective is None or objective.group(1) not in run.data.metrics:
        return candidate
    return Candidate(
        run_id,
        model_id,
        candidate.model_uri,
        value=float(run.data.metrics[objective.group(1)]),
        direction=objective.group(2),
        study=parent.get("sweep.study_name"),
        trial=int(trial) if trial is not None else None,
        metric=objective.group(1),
    )


def _version(client: Any, name: str, candidate: Candidate) -> tuple[str, bool]:
    for version in client.search_model_versions(f"name = '{name}'"):
        if candidate.model_id in (version.model_id, version.tags.get(MODEL_ID_TAG)):
            return str(version.version), False
    created = client.create_model_version(
        name,
        source=candidate.model_uri,  # not models:/m-...: MLflow would look that up elsewhere
        run_id=candidate.run_id,
        tags=candidate.tags(),
        model_id=candidate.model_id,
    )
    return str(created.version), True


def _best(client: Any, name: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, BEST_ALIAS)
    except MlflowException:
        return None


def _improves(candidate: Candidate, current: Any) -> bool:
    """Whether ``candidate``'s value beats the one the ``best`` version carries (a version
    without one is beaten by any value; a candidate without one beats nothing)."""
    if candidate.value is None or math.isnan(candidate.value):
        return False
    try:
        value = float(current.tags[VALUE_TAG])
    except (KeyError, ValueError):
        return True
    if candidate.direction == "maximize":
        return candidate.value > value
    return candidate.value < value
