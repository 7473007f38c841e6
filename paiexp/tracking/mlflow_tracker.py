"""MLflow tracking: one run per job, written with few round trips (create_run + log_batch).

What a run holds: params (flattened hyperparameters and the job's image, instance type,
backend, command), metrics with steps, tags (job name and id, backend, status, model URI,
console URL, code version, config hash), and artifacts (the resolved config, the spec, the
hyperparameters and the job's log), its input channels as datasets, its model as a logged
model.  Every MLflow client call of paiexp is made here (or by :mod:`paiexp.tracking.models`,
:mod:`paiexp.tracking.datasets` and :mod:`paiexp.tracking.store_merge` on this tracker's client),
and params
and tags are cut to MLflow's limits here.  MLflow is imported only when a tracker is created.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paiexp.backends.base import JobState
from paiexp.config.record import RunRecord
from paiexp.config.tracker_uri import (
    SERVERS,
    check_tracking_uri,
    database_engine,
    is_databricks,
    tracking_uri,
    uri_scheme,
)
from paiexp.errors import UserError
from paiexp.metrics.extraction import MetricPoint
from paiexp.tracking.cost import CURRENCY_TAG
from paiexp.tracking.models import (
    MODEL_URI_TAG,
    complete_external_model,
    link_final_metrics,
    new_external_model,
)
from paiexp.tracking.sqlite_store import copy_template, create_sqlite_database, new_sqlite_path
from paiexp.util.diskfull import disk_full
from paiexp.util.redact import redact_url, redact_urls

if TYPE_CHECKING:
    from paiexp.tracking.models import Candidate, Registered
    from paiexp.tracking.monitor import JobResult
    from paiexp.tracking.store_merge import StoreMerge

TAG_PREFIX = "paiexp."
JOB_NAME_TAG = "paiexp.job_name"
SWEEP_ID_TAG = "paiexp.sweep_id"
KIND_TAG = "paiexp.kind"
BEST_TAG = "paiexp.best"
STUDY_NAME_TAG = "paiexp.study_name"  # a sweep's parent run: its study
STEP_TAG = "paiexp.pipeline_step"  # a pipeline step's run: the step
BEST_RUN_TAG = "paiexp.best_run_id"  # on a sweep's parent run: its best trial's run
BEST_MODEL_TAG = "paiexp.best_model_uri"  # and where that run's model is
EMPTY_MODEL_TAG = "paiexp.model_empty"  # a job that succeeded leaving its model channel empty
PARENT_RUN_TAG = "mlflow.parentRunId"
# The MLflow UI opens an experiment on the view its kind names: training runs, not GenAI traces.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT = "custom_model_development"
CONFIG_ARTIFACT = "config/resolved.yaml"
SPEC_ARTIFACT = "job/spec.json"
HYPERPARAMETERS_ARTIFACT = "job/hyperparameters.json"
MAX_TAG_CHARS = 5000
SERVER_CHECK_SECONDS = 5.0  # how long a tracking server has to answer the start-up check
PARAM_MAX_CHARS = 6000

# The MLflow run status that each ending of a job, or of an Optuna trial (by its TrialState
# name), gives its run; and the statuses of a closed run.
JOB_STATE_TO_RUN_STATUS = {
    JobState.SUCCEEDED: "FINISHED",
    JobState.FAILED: "FAILED",
    JobState.STOPPED: "KILLED",
}
TRIAL_STATE_TO_RUN_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "KILLED"}
TERMINAL_RUN_STATUSES = frozenset(JOB_STATE_TO_RUN_STATUS.values())


@dataclass(frozen=True)
class TrackedRun:
    run_id: str
    experiment_id: str
    status: str
    tags: dict[str, str]
    deleted: bool = False


def check_tracking_server(uri: str) -> None:
    """A tracking server (http, https) answers one cheap request within a few seconds, else
    a UserError naming ``tracker.uri``: MLflow's own client retries for minutes before it
    fails, so this runs before any job or run exists.  So does a database server."""
    if database_engine(uri) not in (None, "sqlite"):
        check_database_server(uri)
    if is_databricks(uri):
        check_databricks_credentials(uri)
    if uri_scheme(uri) not in SERVERS:
        return
    import requests

    insecure = os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true"
    verify: bool | str = not insecure and os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH", True)
    try:
        requests.get(f"{uri.rstrip('/')}/health", timeout=SERVER_CHECK_SECONDS, verify=verify)
    except requests.RequestException as exc:
        raise UserError(
            f"tracker.uri: no MLflow tracking server answers at {redact_url(uri)} "
            f"({_unreachable(exc)}); start one, or set tracker.uri to one that runs"
        ) from None


def check_database_server(uri: str) -> None:
    """A database server takes a connection within a few seconds, else a UserError naming
    ``tracker.uri`` (MLflow retries for nearly two minutes, printing each failure)."""
    import threading

    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from paiexp.util.outage import describe

    reasons: list[str] = []  # what went wrong: "" when it connected

    def connect() -> None:
        try:
            engine = create_engine(uri, poolclass=NullPool)
            engine.connect().close()
            engine.dispose()
            reasons.append("")
        except Exception as exc:
            reasons.append(describe(exc))

    attempt = threading.Thread(target=connect, name="paiexp-database-check", daemon=True)
    attempt.start()
    attempt.join(SERVER_CHECK_SECONDS)
    reason = reasons[0] if reasons else f"no answer within {SERVER_CHECK_SECONDS:g} s"
    if not reason:
        return
    raise UserError(
        f"tracker.uri: no database server takes a connection at {redact_urls(uri)} "
        f"({reason}); start one, or set tracker.uri to one that runs"
    )


def check_databricks_credentials(uri: str) -> None:
    """MLflow finds Databricks credentials for ``uri`` (as its first call would, after a job
    is submitted), else a UserError naming ``tracker.uri``; its warning that the Databricks
    SDK found none, before it tries its older ways, is left unsaid."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.databricks_utils import get_databricks_host_creds

    said = logging.getLogger("mlflow.utils.databricks_utils")
    level = said.level
    said.setLevel(logging.ERROR)
    try:
        get_databricks_host_creds(uri)
    except MlflowException:
        raise UserError(
            f"tracker.uri: MLflow finds no Databricks credentials for {redact_urls(uri)}; set "
            "DATABRICKS_HOST and DATABRICKS_TOKEN, or log in with `databricks auth login`"
        ) from None
    finally:
        said.setLevel(level)


# The answers MLflow's own client retries (it calls them transient), as the tracker does.
TRANSIENT_HTTP_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def transient_tracking_error(exc: BaseException) -> bool:
    """Whether a failed MLflow call may succeed once the tracking store is back: a server that
    gave no answer, or answered with a status MLflow's client retries; a database store whose
    server is gone.  An answer that rejects the call (4xx) is no outage."""
    import requests
    from mlflow.exceptions import RestException

    from paiexp.util.outage import chain, transient_database_error

    for error in chain(exc):
        if isinstance(error, requests.HTTPError) and error.response is not None:
            return error.response.status_code in TRANSIENT_HTTP_STATUSES
        if isinstance(error, RestException):  # the server's own error answer
            return error.get_http_status_code() in TRANSIENT_HTTP_STATUSES
        if isinstance(error, requests.RequestException | ConnectionError | TimeoutError):
            return True  # no answer; a RetryError: MLflow's retried statuses persisted
    return transient_database_error(exc)


def _unreachable(exc: Exception) -> str:
    """Why the start-up check got no answer, in a few words."""
    import requests

    from paiexp.util.outage import describe

    if isinstance(exc, requests.Timeout):
        return f"no answer within {SERVER_CHECK_SECONDS:g} s"
    return describe(exc)


@contextmanager
def _creating_store(uri: str) -> Iterator[None]:
    """A new SQLite store that cannot be made (its directory read-only, say) is a UserError
    naming ``tracker.uri``; a full disk stays what it is (the command line tells it so)."""
    try:
        yield
    except OSError as exc:
        if disk_full(exc) is not None:
            raise
        reason = exc.strerror or str(exc)
        raise UserError(f"tracker.uri: cannot create the SQLite store {uri} ({reason})") from None


class MlflowTracker:
    def __init__(
        self, uri: str | None, experiment: str | None, *, check_server: bool = True
    ) -> None:
        """``experiment``: the one runs are created in (made if new); None for a tracker that
        only reads runs.  ``check_server``: a tracking server that does not answer is a
        UserError at once (the sweep's tracking process, which rides out outages, checked it
        before)."""
        self.uri = tracking_uri(uri)
        check_tracking_uri(uri)
        if check_server:
            check_tracking_server(self.uri)
        new_database = new_sqlite_path(self.uri)
        with _creating_store(self.uri):
            if new_database is not None and copy_template(new_database):
                new_database = None  # a copy of the cached empty schema: milliseconds
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # paiexp prints where to browse once; MLflow would print two lines (and read the run
        # again) for each run it closes on a tracking server
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        from mlflow.tracking import MlflowClient

        for name in ("mlflow", "alembic"):  # their set-up chatter is not the user's business
            logging.getLogger(name).setLevel(logging.WARNING)
        if new_database is not None:  # once per machine and MLflow version: build the cache
            with _creating_store(self.uri):
                create_sqlite_database(self.uri)
        self._client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._experiment_id(experiment) if experiment else ""

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            if EXPERIMENT_KIND_TAG not in experiment.tags:  # made before paiexp tagged it
                self._client.set_experiment_tag(
                    experiment.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT
                )
            return str(experiment.experiment_id)
        try:
            return str(
                self._client.create_experiment(
                    name, tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT}
                )
            )
        except MlflowException:  # created concurrently by another launcher
            experiment = self._client.get_experiment_by_name(name)
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
            tags[PARENT_RUN_TAG] = parent_run_id
        tags.update(extra_tags or {})
        return self._create(run_name or record.spec.name, tags)

    def sweep_run(self, run_id: str | None, sweep_id: str) -> str | None:
        """``run_id`` if it is the parent run of ``sweep_id`` in this experiment (a study's
        record may name a run of another tracking store, or a deleted one)."""
        run = self.get_run(run_id) if run_id else None
        if run is None or run.deleted or run.experiment_id != self.experiment_id:
            return None
        tags = run.tags
        return (
            run_id if tags.get(KIND_TAG) == "sweep" and tags.get(SWEEP_ID_TAG) == sweep_id else None
        )

    def find_sweep_run(self, sweep_id: str) -> str | None:
        """The parent run of ``sweep_id`` (the oldest, if several launchers made one)."""
        return self._oldest(_sweep_filter(sweep_id))

    def create_sweep_run(
        self, sweep_id: str, *, run_name: str, tags: Mapping[str, str], params: Mapping[str, str]
    ) -> str:
        """A new parent run of ``sweep_id``, unless another launcher's is older (see
        :meth:`_resolve`)."""
        run_id = self._create(run_name, {SWEEP_ID_TAG: sweep_id, KIND_TAG: "sweep", **tags})
        self._client.log_batch(run_id, params=_params(params))
        return self._resolve(run_id, _sweep_filter(sweep_id))

    def child_run(self, parent_run_id: str, job_name: str) -> TrackedRun | None:
        """The run of the job called ``job_name`` under a parent run (the oldest, if several)."""
        runs = self._search(_child_filter(parent_run_id, job_name))
        return _tracked(min(runs, key=_age)) if runs else None

    def create_child_run(
        self,
        record: RunRecord,
        *,
        run_name: str,
        parent_run_id: str,
        extra_tags: Mapping[str, str],
    ) -> str:
        """A trial's run, under ``parent_run_id``."""
        return self.create_run(
            record, run_name=run_name, parent_run_id=parent_run_id, extra_tags=extra_tags
        )

    def resolve_child(self, run_id: str, parent_run_id: str, job_name: str) -> str:
        """The run of a job under a parent run once ``run_id`` was made for it: the oldest
        (see :meth:`_resolve`)."""
        return self._resolve(run_id, _child_filter(parent_run_id, job_name))

    def delete_run(self, run_id: str) -> None:
        self._client.delete_run(run_id)

    def _resolve(self, run_id: str, filter_string: str) -> str:
        """The run that holds an identity once ``run_id`` was created for it: the oldest run
        carrying it (start time, then run id), the rule every launcher applies alike; a
        younger ``run_id`` is deleted.  MLflow has no unique constraint on tags: this is
        create-then-resolve, exact unless a launcher stalls between stamping its run's start
        time and committing it while another creates and resolves (see README)."""
        winner = self._oldest(filter_string) or run_id
        if winner != run_id:
            self._client.delete_run(run_id)
        return winner

    def _oldest(self, filter_string: str) -> str | None:
        runs = self._search(filter_string)
        return str(min(runs, key=_age).info.run_id) if runs else None

    def _search(self, filter_string: str) -> list[Any]:
        return list(self._client.search_runs([self.experiment_id], filter_string, max_results=1000))

    def tag_best(self, parent_run_id: str, run_id: str) -> None:
        """Tag ``run_id`` the study's best, and no other child of the parent (launchers
        sharing the study each tag their view of it); the parent names it and its model."""
        tagged = self._search(
            f"tags.`{PARENT_RUN_TAG}` = '{parent_run_id}' and tags.`{BEST_TAG}` = 'true'"
        )
        for run in tagged:
            if run.info.run_id != run_id:
                self.set_tags(run.info.run_id, {BEST_TAG: "false"})
        self.set_tags(run_id, {BEST_TAG: "true"})
        best = self.get_run(run_id)
        made = best is not None and best.tags.get(EMPTY_MODEL_TAG) != "true"
        model_uri = best.tags.get(MODEL_URI_TAG) if best and made else None
        self._client.log_batch(
            parent_run_id, tags=_tags({BEST_RUN_TAG: run_id, BEST_MODEL_TAG: model_uri or "-"})
        )

    def _create(self, run_name: str, tags: Mapping[str, str]) -> str:
        run = self._client.create_run(
            self.experiment_id, run_name=run_name, tags={k: _clip(v) for k, v in tags.items()}
        )
        return str(run.info.run_id)

    def log_record(self, run_id: str, record: RunRecord) -> None:
        """Params and config artifacts of a run; safe to repeat (same values).

        The three artifacts go in one upload of a directory (what ``log_text`` and ``log_dict``
        would write, byte for byte), not one temporary directory and upload each."""
        self._client.log_batch(run_id, params=_params(record.params()))
        self._upload(run_id, _record_files(record))
        self.log_datasets(run_id, record)

    def _upload(self, run_id: str, files: Mapping[str, str | Path]) -> None:
        """Files as the run's artifacts, in one upload: artifact path -> its text, or the
        file to upload (linked, not copied, into the directory uploaded)."""
        import tempfile

        with tempfile.TemporaryDirectory() as directory:
            for name, content in files.items():
                path = Path(directory, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, Path):
                    path.symlink_to(content.resolve())
                else:
                    path.write_text(content, encoding="utf-8")
            self._client.log_artifacts(run_id, directory)

    def log_datasets(self, run_id: str, record: RunRecord) -> None:
        """A run's input channels as its MLflow dataset inputs (see
        :mod:`paiexp.tracking.datasets`)."""
        import yaml

        from paiexp.tracking.datasets import dataset_inputs

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where it is built
        backend = (yaml.load(record.config_yaml, Loader=loader) or {}).get("backend") or {}
        datasets = dataset_inputs(record.spec.inputs, backend)
        if not datasets:
            return
        from mlflow.exceptions import MlflowException

        try:
            self._client.log_inputs(run_id, datasets=datasets)
        except MlflowException:
            # jobs submitted at once with the same input: MLflow's store looks a dataset up,
            # then inserts it, and the second insert fails; the dataset now exists to link to
            self._client.log_inputs(run_id, datasets=datasets)

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """Params, each cut to MLflow's limit (a Hydra app's config: see paiexp.hydra_launch)."""
        self._client.log_batch(run_id, params=_params(params))

    def set_tags(self, run_id: str, tags: Mapping[str, str | None]) -> None:
        """Set the tags whose value is not None."""
        items = _tags(tags)
        if items:
            self._client.log_batch(run_id, tags=items)

    def log_metrics(
        self,
        run_id: str,
        points: Iterable[MetricPoint],
        *,
        tags: Mapping[str, str | None] | None = None,
        resumed: bool = False,
    ) -> None:
        """Metric points, and any ``tags`` with them, in one round trip.  ``resumed``: the run
        may hold some of the points already (an earlier try or launch wrote them): those are
        left out."""
        metrics = _metrics(points)
        if resumed:
            metrics = self._unheld(run_id, metrics)
        items = _tags(tags or {})
        if metrics or items:
            self._client.log_batch(run_id, metrics=metrics, tags=items)

    def log_artifact(self, run_id: str, path: Path, artifact_dir: str) -> None:
        self._client.log_artifact(run_id, str(path), artifact_dir)

    def log_instance_logs(self, run_id: str, result: JobResult) -> None:
        """Each instance's log of a multi-instance job as ``logs/<job>/<instance>.log``, in
        one upload."""
        import shutil
        import tempfile

        if not result.instance_logs:
            return
        with tempfile.TemporaryDirectory() as directory:
            for name, path in result.instance_logs.items():
                shutil.copyfile(path, Path(directory, f"{name}.log"))
            self._client.log_artifacts(run_id, directory, f"logs/{result.handle.name}")

    def set_status(self, run_id: str, status: str) -> None:
        """Change a run's status without ending it (a resumed sweep's parent: RUNNING)."""
        self._client.update_run(run_id, status=status)

    def terminate(self, run_id: str, status: str) -> None:
        """Close a run with one of :data:`TERMINAL_RUN_STATUSES`."""
        self._client.set_terminated(run_id, status=status)

    def finish(
        self,
        run_id: str,
        result: JobResult,
        *,
        unlogged: Sequence[MetricPoint] = (),
        status: str | None = None,
        reason: str | None = None,
        extra_tags: Mapping[str, str] | None = None,
        logged_at: float | None = None,
        resumed: bool = False,
        record: RunRecord | None = None,
        log_record: bool = False,
        own_store: Path | None = None,
        merge: StoreMerge | None = None,
    ) -> None:
        """Log what a finished job left (metrics, outputs, log, what it logged with MLflow
        itself) and close the run.

        ``status`` and ``reason`` override what the job's own state implies (a sweep fails a
        trial whose job succeeded but never printed the objective).  ``logged_at`` (epoch
        seconds, default now) stamps the platform's final metrics.  ``resumed``: an earlier
        try, or a launcher that is gone, may have written part of this already; a metric
        step the run holds is not logged again (MLflow would keep a second point at another
        time), and everything else written here is safe to repeat.

        ``record``: the run's record, when this tracker made the run and it holds nothing else
        yet but points ``unlogged`` repeats (each metric's last point logged while its job ran:
        MLflow keeps an equal point once): its model is then made from it, and its final
        metrics linked to the model in the same batch, without reading the run back.
        ``log_record``: the record is not logged yet (the job ended before its run was made):
        its params, files and datasets go with the rest, in the same batch and upload.
        ``own_store``: the store the job's own MLflow calls made
        (:meth:`Backend.own_mlflow_store`), merged into the run by ``merge`` (one that merged
        part of it as the job ran), else by a new one.
        """
        from mlflow.entities import Metric

        status = status or JOB_STATE_TO_RUN_STATUS[result.status.state]
        if reason is None and result.status.state is not JobState.SUCCEEDED:
            reason = result.status.reason
        now = int((time.time() if logged_at is None else logged_at) * 1000)
        metrics = _metrics(unlogged)
        for name, value in result.output_parameters.items():
            step = len(result.series.get(name, ()))
            metrics.append(Metric(name, value, now, step))
        cost = result.cost
        metrics.extend(Metric(k, v, now, 0) for k, v in (cost.metrics() if cost else {}).items())
        if resumed:
            metrics = self._unheld(run_id, metrics)
        tags: dict[str, str | None] = {
            "paiexp.status": result.status.state.value,
            MODEL_URI_TAG: result.outputs.get("model"),
            "paiexp.console_url": result.console_url,
            "paiexp.failure_reason": reason,
            "paiexp.log_tail": "\n".join(result.log_tail) if status == "FAILED" else None,
            "paiexp.warning": "\n".join(result.warnings) or None,
            EMPTY_MODEL_TAG: "true" if result.model_empty else None,
            CURRENCY_TAG: cost.currency if cost else None,
            **(extra_tags or {}),
        }
        for channel, uri in result.outputs.items():
            tags[f"paiexp.output.{channel}"] = uri
        if result.mismatches:
            tags["paiexp.metric_mismatch"] = "; ".join(
                f"{name}: log {log_value:g}, platform {platform_value:g}"
                for name, (log_value, platform_value) in sorted(result.mismatches.items())
            )
        params = {"paiexp.model_uri": result.model_uri} if result.model_uri else {}
        files: dict[str, str | Path] = {}
        if record is not None and log_record:
            params = {**record.params(), **params}
            files.update(_record_files(record))
        model_uri = result.model_uri if status == "FINISHED" and not result.model_empty else None
        model = None
        if model_uri and record is not None and not resumed:
            model = self._new_model(run_id, record, model_uri)
            linked = link_final_metrics(metrics, model.model_id, run_id)
            if linked is None:  # the model's metrics are then linked as a run's are
                model = None
            else:
                metrics = linked
        self._client.log_batch(run_id, metrics=metrics, params=_params(params), tags=_tags(tags))
        log = result.log_path if result.log_path is not None and result.log_path.exists() else None
        if files:
            self._upload(run_id, {**files, **({f"logs/{log.name}": log} if log else {})})
        elif log is not None:
            self.log_artifact(run_id, log, "logs")
        if record is not None and log_record:
            self.log_datasets(run_id, record)
        self.log_instance_logs(run_id, result)
        if own_store is not None:  # after paiexp's own params: the job's never replace them
            merge = merge or self.store_merge(run_id, result.handle.name, resumed=resumed)
            self._merge_store(run_id, result, own_store, merge)
        if model is not None:
            complete_external_model(self._client, model, run_id)
        elif model_uri:
            self.log_model(run_id, model_uri)
        self.terminate(run_id, status)

    def store_merge(self, run_id: str, job_name: str, *, resumed: bool) -> StoreMerge:
        """Merges of job ``job_name``'s own MLflow store into its run (see
        :mod:`paiexp.tracking.store_merge`); ``resumed``: the run may hold part of it already."""
        from paiexp.tracking.store_merge import StoreMerge

        protected = (
            CONFIG_ARTIFACT,
            SPEC_ARTIFACT,
            HYPERPARAMETERS_ARTIFACT,
            f"logs/{job_name}.log",
            f"logs/{job_name}/",
        )
        return StoreMerge(self._client, run_id, job_name, resumed=resumed, protected=protected)

    def _merge_store(self, run_id: str, result: JobResult, store: Path, merge: StoreMerge) -> None:
        """The job's own store merged into its run; its warnings are the run's too.  A store
        MLflow cannot read is one warning, the run closed all the same."""
        from paiexp.tracking.store_merge import Unreadable

        try:
            said = merge.merge(store)
        except Unreadable as exc:
            said = [f"job {result.handle.name}: its own MLflow store {store} is unreadable ({exc})"]
        if said:
            result.warnings.extend(said)
            self.set_tags(run_id, {"paiexp.warning": "\n".join(result.warnings)})

    def _new_model(self, run_id: str, record: RunRecord, model_uri: str) -> Any:
        """A new logged model of a run this tracker made, from the run's record."""
        return new_external_model(
            self._client,
            self.experiment_id,
            run_id,
            name=record.spec.name,
            model_uri=model_uri,
            params=record.params(),
        )

    def run_model(self, run_id: str) -> str | None:
        """The id of the logged model ``run_id`` produced, if any."""
        from paiexp.tracking.models import run_model

        return run_model(self._client, self.experiment_id, run_id)

    def model_uri(self, model_id: str) -> str:
        """Where a logged model's files are."""
        from paiexp.tracking.models import model_uri

        return model_uri(self._client, model_id)

    def register(self, name: str, candidate: Candidate) -> Registered:
        """Register ``candidate``'s model in ``name`` (see
        :func:`paiexp.tracking.models.register`)."""
        from paiexp.tracking.models import register

        return register(self._client, name, candidate)

    def register_run(self, run_id: str, name: str) -> Registered:
        """Register the model of ``run_id`` (see :func:`paiexp.tracking.models.run_candidate`)."""
        from paiexp.tracking.models import register, run_candidate

        return register(self._client, name, run_candidate(self._client, run_id))

    def log_model(self, run_id: str, model_uri: str) -> str:
        """The model a run's job wrote, as an MLflow logged model (see
        :mod:`paiexp.tracking.models`)."""
        from paiexp.tracking.models import log_external_model

        return log_external_model(self._client, self.experiment_id, run_id, model_uri)

    def fail(self, run_id: str, reason: str) -> None:
        """Close a run whose job never got to run (e.g. the submission itself failed)."""
        self.set_tags(
            run_id, {"paiexp.status": JobState.FAILED.value, "paiexp.failure_reason": reason}
        )
        self.terminate(run_id, "FAILED")

    def create_tagged_run(self, run_name: str, tags: Mapping[str, str]) -> str:
        """A run of tags only (a pipeline's parent run, a pipeline step that did not run)."""
        return self._create(run_name, tags)

    # -- reading ---------------------------------------------------------------------------

    def find_run(self, job_name: str) -> TrackedRun | None:
        """The run that tracks the job called ``job_name``, in any experiment."""
        runs = self._client.search_runs(
            experiment_ids=[e.experiment_id for e in self._client.search_experiments()],
            filter_string=f"tags.`{JOB_NAME_TAG}` = '{job_name}'",
            max_results=1,
        )
        return _tracked(runs[0]) if runs else None

    def runs_tagged_anywhere(self, tags: Mapping[str, str]) -> list[TrackedRun]:
        """The runs of any experiment that carry every one of ``tags``, the newest first."""
        runs = self._client.search_runs(
            experiment_ids=[e.experiment_id for e in self._client.search_experiments()],
            filter_string=" and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items()),
            max_results=1000,
            order_by=["attributes.start_time DESC"],
        )
        return [_tracked(run) for run in runs]

    def find_tagged_run(self, key: str, value: str) -> TrackedRun | None:
        """A run of this experiment tagged ``key`` = ``value`` (the oldest, if several)."""
        runs = self._client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{key}` = '{value}'",
            max_results=1,
            order_by=["attributes.start_time ASC"],
        )
        return _tracked(runs[0]) if runs else None

    def child_runs(self, parent_run_id: str) -> dict[str, TrackedRun]:
        """A parent run's children, by the name of the job each tracks."""
        found = self._client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_RUN_TAG}` = '{parent_run_id}'",
            max_results=50000,
        )
        return {run.data.tags.get(JOB_NAME_TAG, ""): _tracked(run) for run in found}

    def final_metrics(self, run_id: str) -> dict[str, float]:
        """Each metric's last value on the run."""
        return dict(self._client.get_run(run_id).data.metrics)

    def metric_series(self, run_id: str, name: str) -> list[tuple[int, float]]:
        """A metric's (step, value) points on the run, by step."""
        history = self._client.get_metric_history(run_id, name)
        return sorted((m.step, m.value) for m in history)

    def logged_steps(self, run_id: str, names: Iterable[str] | None = None) -> dict[str, set[int]]:
        """The steps of each metric (of ``names``; None: of every one) a run holds."""
        if names is None:
            names = self._client.get_run(run_id).data.metrics
        return {
            name: {m.step for m in self._client.get_metric_history(run_id, name)} for name in names
        }

    def _unheld(self, run_id: str, metrics: list[Any]) -> list[Any]:
        """The MLflow metrics of ``metrics`` whose step the run does not hold yet."""
        held = self.logged_steps(run_id, {m.key for m in metrics})
        return [m for m in metrics if m.step not in held[m.key]]

    def get_run(self, run_id: str) -> TrackedRun | None:
        """The run with this id; None when MLflow has none."""
        from mlflow.exceptions import MlflowException

        try:
            return _tracked(self._client.get_run(run_id))
        except MlflowException:
            return None

    def run_params(self, run_id: str) -> dict[str, str]:
        """A run's params."""
        return dict(self._client.get_run(run_id).data.params)

    def runs_tagged(self, key: str, values: Iterable[str]) -> dict[str, str]:
        """The run of this experiment tagged ``key`` = each value (the oldest), by value."""
        found = {}
        for value in values:
            runs = self._search(f"tags.`{key}` = '{value}'")
            if runs:
                found[value] = str(min(runs, key=_age).info.run_id)
        return found

    def create_ended_run(
        self,
        run_name: str,
        *,
        start_time: float,
        end_time: float,
        status: str,
        tags: Mapping[str, str | None],
        params: Mapping[str, str],
        points: Iterable[MetricPoint],
        unique_tag: tuple[str, str],
    ) -> str:
        """A run of something that ran elsewhere, already ended (times in epoch seconds):
        created with its tags, then its params and metrics in one batch, then closed.  The
        oldest run carrying ``unique_tag`` (key, value) is kept (see :meth:`_resolve`)."""
        run = self._client.create_run(
            self.experiment_id,
            start_time=int(start_time * 1000),
            run_name=run_name,
            tags={k: _clip(v) for k, v in tags.items() if v is not None},
        )
        run_id = str(run.info.run_id)
        self._client.log_batch(run_id, metrics=_metrics(points), params=_params(params))
        self._client.set_terminated(run_id, status=status, end_time=int(end_time * 1000))
        key, value = unique_tag
        return self._resolve(run_id, f"tags.`{key}` = '{value}'")

    def load_text(self, run_id: str, artifact: str) -> str:
        import mlflow

        return str(mlflow.artifacts.load_text(f"{self.artifact_uri(run_id)}/{artifact}"))

    def artifact_uri(self, run_id: str) -> str:
        return str(self._client.get_run(run_id).info.artifact_uri)


def _tracked(run: Any) -> TrackedRun:
    return TrackedRun(
        run_id=run.info.run_id,
        experiment_id=run.info.experiment_id,
        status=run.info.status,
        tags=dict(run.data.tags),
        deleted=run.info.lifecycle_stage == "deleted",
    )


def _age(run: Any) -> tuple[int, str]:
    """Older first: start time, then run id (the same order for every launcher)."""
    return run.info.start_time or 0, run.info.run_id


def _sweep_filter(sweep_id: str) -> str:
    return f"tags.`{SWEEP_ID_TAG}` = '{sweep_id}' and tags.`{KIND_TAG}` = 'sweep'"


def _child_filter(parent_run_id: str, job_name: str) -> str:
    return f"tags.`{PARENT_RUN_TAG}` = '{parent_run_id}' and tags.`{JOB_NAME_TAG}` = '{job_name}'"


def _record_files(record: RunRecord) -> dict[str, str | Path]:
    """A run's config artifacts: the resolved config, the spec, the hyperparameters."""
    import json

    hyperparameters = json.dumps(record.spec.hyperparameters, indent=2, default=str)
    return {
        CONFIG_ARTIFACT: record.config_yaml,
        SPEC_ARTIFACT: record.spec_json(),
        HYPERPARAMETERS_ARTIFACT: hyperparameters,
    }


def _params(values: Mapping[str, str]) -> list[Any]:
    """MLflow params, each cut to MLflow's limit."""
    from mlflow.entities import Param

    return [Param(key, value[:PARAM_MAX_CHARS]) for key, value in values.items()]


def _tags(values: Mapping[str, str | None]) -> list[Any]:
    """MLflow tags of the values that are not None, each clipped to :data:`MAX_TAG_CHARS`."""
    from mlflow.entities import RunTag

    return [RunTag(key, _clip(value)) for key, value in values.items() if value is not None]


def _metrics(points: Iterable[MetricPoint]) -> list[Any]:
    from mlflow.entities import Metric

    return [Metric(p.name, p.value, round(p.timestamp * 1000), p.step) for p in points]


def _clip(value: str) -> str:
    return value if len(value) <= MAX_TAG_CHARS else "..." + value[-(MAX_TAG_CHARS - 3) :]
