"""MLflow tracking: one run per job, written with few round trips (create_run + log_batch).

What a run holds: params (flattened hyperparameters and the job's image, instance type,
backend, command), metrics with steps, tags (job name and id, backend, status, model URI,
console URL, code version, config hash), and artifacts (the resolved config, the spec, the
hyperparameters and the job's log).  MLflow is imported only when a tracker is created.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paiexp.backends.base import JobState
from paiexp.cache import cache_root
from paiexp.metrics import MetricPoint
from paiexp.record import RunRecord

if TYPE_CHECKING:
    from paiexp.monitor import JobResult

TAG_PREFIX = "paiexp."
JOB_NAME_TAG = "paiexp.job_name"
CONFIG_ARTIFACT = "config/resolved.yaml"
SPEC_ARTIFACT = "job/spec.json"
RUN_STATUS = {
    JobState.SUCCEEDED: "FINISHED",
    JobState.FAILED: "FAILED",
    JobState.STOPPED: "KILLED",
}
MAX_TAG_CHARS = 5000
PARAM_MAX_CHARS = 6000


@dataclass(frozen=True)
class TrackedRun:
    run_id: str
    experiment_id: str
    status: str
    tags: dict[str, str]


class MlflowTracker:
    def __init__(self, uri: str | None, experiment: str) -> None:
        # MLflow's own default, known without importing it: $MLFLOW_TRACKING_URI, else
        # sqlite:///mlflow.db in the working directory.
        self.uri = (
            uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{os.path.abspath('mlflow.db')}"
        )
        creating = _start_sqlite_creation(self.uri)  # runs while MLflow imports here
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        from mlflow.tracking import MlflowClient

        for name in ("mlflow", "alembic"):  # their set-up chatter is not the user's business
            logging.getLogger(name).setLevel(logging.WARNING)
        if creating is not None:
            _, errors = creating.communicate()
            if creating.returncode != 0:
                raise RuntimeError(f"creating {self.uri} failed: {errors.strip()[-2000:]}")
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._experiment_id(experiment)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except MlflowException:  # created concurrently by another launcher
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return str(experiment.experiment_id)

    # -- writing ---------------------------------------------------------------------------

    def create_run(
        self,
        record: RunRecord,
        *,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        extra_tags: Mapping[str, str] | None = None,
    ) -> str:
        """Create the run with its tags only (one round trip); see :meth:`log_record`."""
        tags = dict(record.tags())
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        tags.update(extra_tags or {})
        run = self.client.create_run(
            self.experiment_id, run_name=run_name or record.spec.name, tags=tags
        )
        return str(run.info.run_id)

    def log_record(self, run_id: str, record: RunRecord) -> None:
        """Params and config artifacts of a run; safe to repeat (same values)."""
        from mlflow.entities import Param

        params = [Param(key, value[:PARAM_MAX_CHARS]) for key, value in record.params().items()]
        self.client.log_batch(run_id, params=params)
        self.client.log_text(run_id, record.config_yaml, CONFIG_ARTIFACT)
        self.client.log_text(run_id, record.spec_json(), SPEC_ARTIFACT)
        self.client.log_dict(run_id, record.spec.hyperparameters, "job/hyperparameters.json")

    def set_tags(self, run_id: str, tags: Mapping[str, str | None]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, _clip(v)) for k, v in tags.items() if v is not None]
        if items:
            self.client.log_batch(run_id, tags=items)

    def log_metrics(self, run_id: str, points: Iterable[MetricPoint]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(p.name, p.value, int(p.timestamp * 1000), p.step) for p in points]
        if metrics:
            self.client.log_batch(run_id, metrics=metrics)

    def finish(
        self,
        run_id: str,
        result: JobResult,
        *,
        unlogged: Sequence[MetricPoint] = (),
        status: str | None = None,
        reason: str | None = None,
        extra_tags: Mapping[str, str] | None = None,
    ) -> None:
        """Log what a finished job left (metrics, outputs, log) and close the run.

        ``status`` and ``reason`` override what the job's own state implies (a sweep fails a
        trial whose job succeeded but never printed the objective).
        """
        from mlflow.entities import Metric, Param, RunTag

        status = status or RUN_STATUS[result.status.state]
        if reason is None and result.status.state is not JobState.SUCCEEDED:
            reason = result.status.reason
        now = int(time.time() * 1000)
        metrics = [Metric(p.name, p.value, int(p.timestamp * 1000), p.step) for p in unlogged]
        for name, value in result.output_parameters.items():
            step = len(result.series.get(name, ()))
            metrics.append(Metric(name, value, now, step))
        tags: dict[str, str | None] = {
            "paiexp.status": result.status.state.value,
            "paiexp.model_uri": result.outputs.get("model"),
            "paiexp.console_url": result.console_url,
            "paiexp.failure_reason": reason,
            "paiexp.log_tail": "\n".join(result.log_tail) if status == "FAILED" else None,
            **(extra_tags or {}),
        }
        for channel, uri in result.outputs.items():
            tags[f"paiexp.output.{channel}"] = uri
        if result.mismatches:
            tags["paiexp.metric_mismatch"] = "; ".join(
                f"{name}: log {log_value:g}, platform {platform_value:g}"
                for name, (log_value, platform_value) in sorted(result.mismatches.items())
            )
        run_tags = [RunTag(k, _clip(v)) for k, v in tags.items() if v is not None]
        params = [Param("paiexp.model_uri", result.model_uri)] if result.model_uri else []
        self.client.log_batch(run_id, metrics=metrics, params=params, tags=run_tags)
        if result.log_path is not None and result.log_path.exists():
            self.client.log_artifact(run_id, str(result.log_path), "logs")
        self.client.set_terminated(run_id, status=status)

    def fail(self, run_id: str, reason: str) -> None:
        """Close a run whose job never got to run (e.g. the submission itself failed)."""
        self.set_tags(
            run_id, {"paiexp.status": JobState.FAILED.value, "paiexp.failure_reason": reason}
        )
        self.client.set_terminated(run_id, status="FAILED")

    # -- reading ---------------------------------------------------------------------------

    def find_run(self, job_name: str) -> TrackedRun | None:
        """The run that tracks the job called ``job_name``, in any experiment."""
        runs = self.client.search_runs(
            experiment_ids=[e.experiment_id for e in self.client.search_experiments()],
            filter_string=f"tags.`{JOB_NAME_TAG}` = '{job_name}'",
            max_results=1,
        )
        return _tracked(runs[0]) if runs else None

    def logged_steps(self, run_id: str, names: Iterable[str]) -> dict[str, int]:
        """How many steps of each metric a run holds (its highest step + 1)."""
        steps = {}
        for name in names:
            history = self.client.get_metric_history(run_id, name)
            steps[name] = max((m.step for m in history), default=-1) + 1
        return steps

    def get_run(self, run_id: str) -> TrackedRun:
        return _tracked(self.client.get_run(run_id))

    def load_text(self, run_id: str, artifact: str) -> str:
        import mlflow

        return str(mlflow.artifacts.load_text(f"{self.artifact_uri(run_id)}/{artifact}"))

    def artifact_uri(self, run_id: str) -> str:
        return str(self.client.get_run(run_id).info.artifact_uri)


def _tracked(run: Any) -> TrackedRun:
    return TrackedRun(
        run_id=run.info.run_id,
        experiment_id=run.info.experiment_id,
        status=run.info.status,
        tags=dict(run.data.tags),
    )


def _clip(value: str) -> str:
    return value if len(value) <= MAX_TAG_CHARS else "..." + value[-(MAX_TAG_CHARS - 3) :]


def _start_sqlite_creation(uri: str) -> subprocess.Popen[str] | None:
    """Create a new SQLite tracking database: a copy of the cached empty one when there is
    one (milliseconds), else in a child process that builds that cache first (MLflow's
    seconds of schema migrations stay off this process). None when nothing is left to do."""
    path = _new_sqlite_path(uri)
    if path is None or _copy_template(path):
        return None
    code = "import sys; from paiexp.tracking import create_sqlite_database as c; c(sys.argv[1])"
    return subprocess.Popen(
        [sys.executable, "-c", code, uri],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _new_sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    path = Path(uri.removeprefix("sqlite:///")).resolve()
    return None if path.exists() else path


def _template_path() -> Path:
    """An empty tracking database of the installed MLflow version, built once per machine."""
    from importlib.metadata import version

    return cache_root() / f"mlflow-{version('mlflow')}-empty.db"


def create_sqlite_database(uri: str) -> None:
    """Create a new SQLite tracking database atomically, building the cached template first.

    MLflow builds its schema with seconds of migrations; a launcher killed in the middle would
    leave a half-migrated file that every later launch refuses.  So a schema is only ever
    built under a temporary name and linked into place when complete.
    """
    path = _new_sqlite_path(uri)
    if path is None:
        return
    template = _template_path()
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        _build_schema(template)
    except OSError:  # no writable cache: build this database itself
        _build_schema(path)
        return
    _copy_template(path)


def _build_schema(path: Path) -> None:
    from mlflow.tracking._tracking_service.utils import _get_store

    temporary = path.with_name(f".{path.name}.{os.getpid()}.creating")
    try:
        store = _get_store(f"sqlite:///{temporary}")
        store.engine.dispose()
        os.link(temporary, path)  # fails if another process linked its copy first: fine
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)


def _copy_template(path: Path) -> bool:
    """Place a copy of the cached empty database at ``path``; False when there is none."""
    import shutil
    import sqlite3

    template = _template_path()
    if not template.exists():
        return False
    temporary = path.with_name(f".{path.name}.{os.getpid()}.creating")
    try:
        shutil.copyfile(template, temporary)
        with sqlite3.connect(temporary) as connection:  # MLflow's "Default" experiment
            connection.execute(
                "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                (os.path.abspath(os.path.join("mlruns", "0")),),
            )
        connection.close()
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)
    return True
