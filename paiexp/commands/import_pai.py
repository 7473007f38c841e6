"""``paiexp import pai``: PAI training jobs created elsewhere (the PAI console, the PAI SDK)
as MLflow runs, each once.

A job becomes a closed run of the configured experiment: its hyperparameters, image,
instance type and command as params; the service's metrics (``ListTrainingJobMetrics``, as
step series, ``LatestMetrics`` for any missing); its status, model and output OSS paths,
console URL, labels and duration as tags; start and end times from the job's own.  The run
carries the job's id (``paiexp.job_id``): a job that a run of the experiment already tracks
is not imported again, nor is one paiexp launched itself (label ``paiexp-run``), nor one
that has not ended yet.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from paiexp.backends.pai_api import parse_time, running_span
from paiexp.config.compose import Project, compose, to_object
from paiexp.errors import UserError
from paiexp.metrics.extraction import MetricPoint

if TYPE_CHECKING:
    from paiexp.backends.pai_api import PaiApi

JOB_ID_TAG = "paiexp.job_id"
IMPORTED_TAG = "paiexp.imported_from"
PAIEXP_RUN_LABEL = "paiexp-run"  # on every job paiexp launched: its own run tracks it
SDK_MODULES = ("alibabacloud_paistudio20220112", "alibabacloud_credentials")
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
PAGE_SIZE = 100


@dataclass(frozen=True)
class JobSelection:
    """Which jobs: these ids, and those listed by labels and/or a creation time."""

    job_ids: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    since: str | None = None  # ISO 8601 UTC, as ListTrainingJobs' StartTime

    @classmethod
    def parse(
        cls, job_ids: Sequence[str], labels: Sequence[str], since: str | None
    ) -> JobSelection:
        for job_id in job_ids:
            if not JOB_ID.match(job_id):
                raise UserError(f"JOB_ID: {job_id!r} is not a PAI training job id")
        pairs = {}
        for label in labels:
            key, sep, value = label.partition("=")
            if not sep or not key:
                raise UserError(f"--label: expected KEY=VALUE, got {label!r}")
            pairs[key] = value
        if not (job_ids or pairs or since):
            raise UserError("import pai: give JOB_ID..., --label KEY=VALUE or --since DATE")
        return cls(tuple(dict.fromkeys(job_ids)), pairs, _utc(since) if since else None)

    @property
    def listed(self) -> bool:
        return bool(self.labels or self.since)


def import_pai(project: Project, selection: JobSelection, overrides: Sequence[str]) -> int:
    """Import the selected jobs that ended and are not tracked yet; prints what it did."""
    missing = [m for m in SDK_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"paiexp import pai needs {', '.join(missing)}: pip install 'paiexp[pai]'")
    from paiexp.backends.pai import make_api
    from paiexp.runs import open_tracker
    from paiexp.tracking.browse import browse_lines

    config = to_object(compose(project, ["backend=pai", *overrides]))
    workspace = config.backend.workspace_id
    if selection.listed and not workspace:
        raise UserError("backend.workspace_id: needed to list jobs by --label or --since")
    api = make_api(config.backend)
    job_ids = list(selection.job_ids)
    for job_id in _listed(api, selection, workspace) if selection.listed else []:
        if job_id not in job_ids:
            job_ids.append(job_id)
    jobs = [api.get_training_job(job_id) for job_id in job_ids]  # every id checked first
    tracker = open_tracker(config)
    tracked = tracker.runs_tagged(JOB_ID_TAG, job_ids)
    counts = {"imported": 0, "already imported": 0, "launched by paiexp": 0, "not ended": 0}
    for job in jobs:
        name, job_id = job.get("TrainingJobName", ""), str(job["TrainingJobId"])
        labels = _labels(job)
        if job_id in tracked:
            counts["already imported"] += 1
        elif PAIEXP_RUN_LABEL in labels:
            counts["launched by paiexp"] += 1
            print(f"{name} ({job_id}): launched by paiexp, run {labels[PAIEXP_RUN_LABEL]}")
        elif not _ended(job):
            counts["not ended"] += 1
            print(f"{name} ({job_id}): {job.get('Status')}, not imported until it ends")
        else:
            run = imported_run(job, _metric_points(api, job))
            run_id = tracker.create_ended_run(**run, unique_tag=(JOB_ID_TAG, job_id))
            counts["imported"] += 1
            print(f"{name} ({job_id}): {job.get('Status')}, imported as run {run_id}")
    print(", ".join(f"{n} {what}" for what, n in counts.items() if n) or "no jobs selected")
    for line in browse_lines(tracker.uri, tracker.experiment_id):
        print(line)
    return 0


def imported_run(job: dict[str, Any], points: list[MetricPoint]) -> dict[str, Any]:
    """The keyword arguments of :meth:`MlflowTracker.create_ended_run` for one PAI job."""
    from paiexp.backends.pai import status_of
    from paiexp.tracking.mlflow_tracker import JOB_STATE_TO_RUN_STATUS

    status = status_of(job)
    algorithm = job.get("AlgorithmSpec") or {}
    compute = job.get("ComputeResource") or {}
    params = {str(h["Name"]): str(h.get("Value", "")) for h in job.get("HyperParameters") or []}
    job_fields = {
        "job.image": algorithm.get("Image"),
        "job.instance_type": compute.get("EcsSpec"),
        "job.instance_count": compute.get("EcsCount"),
        "job.job_type": algorithm.get("JobType"),
        "job.backend": "pai",
        "job.command": _command(algorithm.get("Command") or []),
    }
    params.update({k: str(v) for k, v in job_fields.items() if v not in (None, "")})
    outputs = {
        str(c["Name"]): str(c["OutputUri"])
        for c in job.get("OutputChannels") or []
        if c.get("Name") and c.get("OutputUri")
    }
    model = (job.get("OutputModel") or {}).get("Uri") or outputs.get("model")
    if model:
        params["paiexp.model_uri"] = model
    tags: dict[str, str | None] = {
        JOB_ID_TAG: str(job["TrainingJobId"]),
        "paiexp.job_name": job.get("TrainingJobName"),
        IMPORTED_TAG: "pai",
        "paiexp.backend": "pai",
        "paiexp.status": status.state.value,
        "paiexp.pai_status": job.get("Status"),
        "paiexp.failure_reason": status.reason,
        "paiexp.model_uri": model,
        "paiexp.console_url": job.get("TrainingJobUrl"),
        "paiexp.image": algorithm.get("Image"),
        "paiexp.workspace_id": job.get("WorkspaceId"),
        "paiexp.duration_seconds": _text(job.get("Duration")),
        **{f"paiexp.output.{channel}": uri for channel, uri in outputs.items()},
        **{f"paiexp.label.{key}": value for key, value in _labels(job).items()},
    }
    start, end = _times(job)
    return {
        "run_name": job.get("TrainingJobName") or str(job["TrainingJobId"]),
        "start_time": start,
        "end_time": end,
        "status": JOB_STATE_TO_RUN_STATUS[status.state],
        "tags": tags,
        "params": params,
        "points": points,
    }


def _listed(api: PaiApi, selection: JobSelection, workspace: str) -> list[str]:
    """The ids ListTrainingJobs gives for the selection's labels and creation time."""
    query: dict[str, Any] = {"WorkspaceId": workspace, "SortBy": "GmtCreateTime", "Order": "asc"}
    if selection.labels:
        query["Labels"] = dict(selection.labels)
    if selection.since:
        query["StartTime"] = selection.since
    ids: list[str] = []
    page = 1
    while True:
        jobs, total = api.list_training_jobs(**query, PageNumber=page, PageSize=PAGE_SIZE)
        ids += [str(job["TrainingJobId"]) for job in jobs]
        if not jobs or page * PAGE_SIZE >= total:
            return ids
        page += 1


def _metric_points(api: PaiApi, job: dict[str, Any]) -> list[MetricPoint]:
    """Every metric point the service recorded, numbered per metric; a metric only in
    ``LatestMetrics`` as its one point."""
    points: list[MetricPoint] = []
    steps: dict[str, int] = {}
    page = 1
    while True:
        metrics, total = api.list_metrics(str(job["TrainingJobId"]), page, PAGE_SIZE)
        for metric in metrics:
            name = str(metric["Name"])
            step = steps.get(name, 0)
            steps[name] = step + 1
            points.append(MetricPoint(name, float(metric["Value"]), step, _epoch(metric)))
        if not metrics or page * PAGE_SIZE >= total:
            break
        page += 1
    for metric in job.get("LatestMetrics") or []:
        if metric.get("Name") and metric["Name"] not in steps and metric.get("Value") is not None:
            points.append(
                MetricPoint(str(metric["Name"]), float(metric["Value"]), 0, _epoch(metric))
            )
    return points


def _ended(job: dict[str, Any]) -> bool:
    from paiexp.backends.pai import status_of

    return status_of(job).state.terminal


def _labels(job: dict[str, Any]) -> dict[str, str]:
    labels = job.get("Labels") or []
    return {str(label["Key"]): str(label.get("Value", "")) for label in labels if "Key" in label}


def _command(command: Sequence[str]) -> str:
    """The shell command of ``sh -c COMMAND`` (how paiexp and the SDK submit), else the argv."""
    if len(command) == 3 and command[0].rsplit("/", 1)[-1] in ("sh", "bash") and command[1] == "-c":
        return str(command[2])
    return shlex.join(command)


def _times(job: dict[str, Any]) -> tuple[float, float]:
    """When the job started running (else was created) and when it ended (else last changed)."""
    running, ended = running_span(job)
    start = running or parse_time(job.get("GmtCreateTime"))
    end = ended or parse_time(job.get("GmtModifiedTime"))
    start = start or end or 0.0
    return start, max(end or start, start)


def _epoch(metric: dict[str, Any]) -> float:
    return parse_time(metric.get("Timestamp")) or 0.0


def _utc(text: str) -> str:
    """``--since``: a date or an ISO 8601 time (UTC unless it says otherwise), as PAI's
    ``2024-01-01T00:00:00Z``."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"--since: {text!r} is not a date (YYYY-MM-DD or an ISO 8601 time)"
        ) from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
