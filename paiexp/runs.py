"""Single runs: compose and validate a job, submit it, follow it, track it in MLflow.

:func:`prepare` does every check a user mistake can fail and imports nothing heavy; only
:func:`execute` creates the MLflow run and submits the job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paiexp.backends import Backend, BackendUnavailable, JobHandle, JobState, create_backend
from paiexp.backends.base import SubmissionFailed
from paiexp.config.compose import Project, compose, from_yaml, to_container, to_object
from paiexp.config.record import make_record
from paiexp.config.schema import Config
from paiexp.config.spec import JobSpec, build_spec
from paiexp.config.tracker_uri import check_tracker
from paiexp.contract import job_mlflow
from paiexp.errors import UserError
from paiexp.metrics.extraction import unmatched_metrics
from paiexp.tracking.browse import browse_lines
from paiexp.tracking.cost import Prices, prices_of, run_cost
from paiexp.tracking.monitor import JobMonitor, JobResult, OwnMetrics, job_log
from paiexp.util.diskfull import disk_full
from paiexp.util.terminal import say, warn

if TYPE_CHECKING:
    from paiexp.tracking.mlflow_tracker import MlflowTracker
    from paiexp.tracking.store_merge import StoreMerge

log = logging.getLogger(__name__)

METRIC_FLUSH_SECONDS = 5.0
FAILED_LOG_LINES = 10  # of a failed job's log, shown at its end when it was not shown as it ran
Echo = Callable[[str], None]


@dataclass(frozen=True)
class PreparedJob:
    """A validated job, ready to submit."""

    config: Config
    data: dict[str, Any]
    spec: JobSpec
    backend: Backend
    base_dir: Path
    overrides: tuple[str, ...]


def unique_job_name(base: str) -> str:
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def prepare(project: Project, overrides: Sequence[str]) -> PreparedJob:
    """Compose the project's config and validate everything about the job."""
    return prepare_config(compose(project, overrides), project.base_dir, tuple(overrides))


def prepare_from_record(config_yaml: str, base_dir: Path, overrides: Sequence[str]) -> PreparedJob:
    """The same job again, from a run's stored config (``key=value`` overrides applied)."""
    return prepare_config(from_yaml(config_yaml, overrides), base_dir, tuple(overrides))


def prepare_config(cfg: Any, base_dir: Path, overrides: tuple[str, ...]) -> PreparedJob:
    """Validate a composed config's job."""
    config = to_object(cfg)
    data = to_container(cfg)
    spec = build_spec(config.job, name=unique_job_name(config.job.name), base_dir=base_dir)
    backend = create_backend(config.backend, base_dir)
    backend.validate(spec)
    prices_of(config.backend)  # its prices checked before anything is submitted
    check_tracker(config.tracker)  # its server is asked as the run is tracked
    return PreparedJob(config, data, spec, backend, base_dir, overrides)


def open_tracker(config: Config) -> MlflowTracker:
    from paiexp.tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker(config.tracker.uri, config.tracker.experiment)


def execute(
    job: PreparedJob,
    tracker: Any,
    *,
    echo: Echo | None = print,
    extra_tags: dict[str, str] | None = None,
) -> tuple[str, JobResult]:
    """Track, submit and follow a prepared job to its end; returns the run id and result."""
    run_id, handle = submit(job, tracker, extra_tags=extra_tags)
    prices = prices_of(job.config.backend)
    result = follow(
        job.backend,
        handle,
        job.spec,
        tracker,
        run_id,
        job.base_dir,
        echo=echo,
        prices=prices,
        direct=bool(job.config.tracker.job_uri),
    )
    return run_id, result


def submit(
    job: PreparedJob, tracker: Any, *, extra_tags: dict[str, str] | None = None
) -> tuple[str, JobHandle]:
    """Track and submit a prepared job: its run id, and its handle on the backend."""
    record = make_record(job.data, job.spec, project_dir=job.base_dir, overrides=job.overrides)
    run_id = tracker.create_run(record, extra_tags=extra_tags)
    tracker.log_record(run_id, record)
    spec = dataclasses.replace(job.spec, labels={**job.spec.labels, "paiexp-run": run_id})
    job_uri = job.config.tracker.job_uri
    if job_uri:  # its own MLflow calls go to its run directly (see paiexp.contract.job_mlflow)
        direct = job_mlflow.direct(job_uri, run_id, tracker.experiment_id)
        spec = dataclasses.replace(spec, environments={**spec.environments, **direct})
    try:
        handle = job.backend.submit(spec)
    except BaseException as exc:
        tracker.fail(run_id, f"submission failed: {exc}")
        if isinstance(exc, OSError) and disk_full(exc) is None:
            raise SubmissionFailed(
                f"job {spec.name} could not be submitted to backend={job.backend.name} "
                f"({exc}); its MLflow run {run_id} is FAILED"
            ) from exc
        raise
    tracker.set_tags(run_id, {"paiexp.job_id": handle.id, "paiexp.status": "SUBMITTED"})
    say(f"job {job.spec.name} submitted to backend={job.backend.name} (MLflow run {run_id})")
    return run_id, handle


def follow(
    backend: Backend,
    handle: JobHandle,
    spec: JobSpec,
    tracker: Any,
    run_id: str,
    base_dir: Path,
    *,
    echo: Echo | None = print,
    logged: Mapping[str, Collection[int]] | None = None,
    prices: Prices | None = None,
    direct: bool = False,
) -> JobResult:
    """Watch a submitted job until it ends, streaming metrics to its run, then close the run
    with what it cost (``prices``: the backend's, none by default: instance-hours only).
    ``direct``: the job's own MLflow calls write its run (``tracker.job_uri``).

    A first Ctrl-C stops the job (the run ends KILLED); a second leaves it running, to be
    picked up again with ``paiexp attach JOB_NAME``.  ``logged``: the metric steps its run
    holds already (a launcher that is gone followed it before), none of them logged again.
    """
    followed_since = time.time()
    log_path = job_log(base_dir, spec.name)
    own_metrics: OwnMetrics = "none" if direct else "read"
    monitor = JobMonitor(
        backend, handle, spec, log_path, echo=echo, logged=logged, own_metrics=own_metrics
    )
    own = OwnStore(backend, handle, tracker, run_id, resumed=logged is not None)
    stopping = False
    last_flush, polled_at = time.monotonic(), -math.inf
    # Its log is pulled (as its backend's log_interval allows) and its new points sent every
    # tick; its state asked only every poll_interval (10 s on PAI, below a tick elsewhere).
    tick = min(backend.poll_interval, METRIC_FLUSH_SECONDS)
    while True:
        try:
            if time.monotonic() - polled_at >= backend.poll_interval:
                polled_at = time.monotonic()
                status = backend.poll([handle])[handle.id]
            monitor.pull(final=status.state.terminal)
            if status.state.terminal:
                break
            if time.monotonic() - last_flush >= METRIC_FLUSH_SECONDS:
                tracker.log_metrics(run_id, monitor.take_unlogged())
                own.merge_live()
                last_flush = time.monotonic()
            backend.wait([handle], tick)
        except BackendUnavailable as exc:  # the job runs on regardless: ask again later
            warn(f"backend unavailable, polling again: {exc}")
            backend.wait([handle], backend.poll_interval)
        except KeyboardInterrupt:
            if stopping:
                say(f"detached; the job goes on. Follow it with: paiexp attach {spec.name}")
                raise
            stopping = True
            say("stopping the job (Ctrl-C again to detach and leave it running)")
            backend.stop(handle)
    result = monitor.result(status)
    result.cost = run_cost(
        spec.instance_type,
        spec.instance_count,
        status.started_at or followed_since,  # a platform that does not say: as seen here
        status.ended_at or time.time(),
        prices or Prices({}, None),
    )
    if status.state is JobState.SUCCEEDED:
        result.warnings.extend(unmatched_metrics(spec.metric_definitions, result.metrics, log_path))
    result.warnings.extend(own.warnings)
    with tempfile.TemporaryDirectory(prefix="paiexp-mlflow-") as scratch:
        tracker.finish(
            run_id,
            result,
            unlogged=monitor.take_unlogged(),
            resumed=logged is not None,
            own_store=backend.own_mlflow_store(handle, Path(scratch)),
            merge=own.merge,
        )
    return result


class OwnStore:
    """What a followed job logs with MLflow itself, merged into its run as it runs where its
    store is on this machine (see :mod:`paiexp.tracking.store_merge`); the rest when it ends."""

    def __init__(
        self, backend: Backend, handle: JobHandle, tracker: Any, run_id: str, *, resumed: bool
    ) -> None:
        self.backend, self.handle, self.tracker, self.run_id = backend, handle, tracker, run_id
        self.resumed = resumed
        self.merge: StoreMerge | None = None  # made once the job's store appears
        self.warnings: list[str] = []  # what its merges said so far

    def merge_live(self) -> None:
        """Merge what the store holds so far, if it is here; a pass that fails (a file the job
        is writing, the tracker away) leaves the rest to a merge that reads the run again."""
        store = self.backend.own_mlflow_store(self.handle, None)
        if store is None:
            return
        if self.merge is None:
            name, resumed = self.handle.name, self.resumed
            self.merge = self.tracker.store_merge(self.run_id, name, resumed=resumed)
        try:
            self.warnings += self.merge.merge(store)
        except Exception as exc:
            log.debug("merging %s's own MLflow store failed; tried again later: %s", store, exc)
            self.merge, self.resumed = None, True


def attach(
    tracker: Any, job_name: str, *, echo: Echo | None = print
) -> tuple[str, JobResult | None]:
    """Find a job by name through its MLflow run, follow it to its end and close the run.

    Returns no result when the run was closed already.
    """
    from paiexp.tracking.mlflow_tracker import TERMINAL_RUN_STATUSES

    if not re.fullmatch(r"[\w-]+", job_name):  # it names a file, and is matched in a filter
        raise UserError(
            f"JOB_NAME: invalid value {job_name!r}; expected a job name (letters, digits, '-')"
        )
    tracked = tracker.find_run(job_name)
    if tracked is None:
        raise UserError(f"no MLflow run in {tracker.uri} tracks a job named {job_name!r}")
    stored = stored_config(tracker, tracked.run_id)
    backend = create_backend(stored.backend, Path(tracked.tags["paiexp.project_dir"]))
    handle = backend.find(job_name)
    if handle is None:
        if tracked.status not in TERMINAL_RUN_STATUSES:
            tracker.fail(tracked.run_id, f"job {job_name} was never submitted")
        raise UserError(f"backend={backend.name} has no job named {job_name!r}")
    if tracked.status in TERMINAL_RUN_STATUSES:
        say(f"run {tracked.run_id} of job {job_name} is already {tracked.status}")
        return tracked.run_id, None
    return tracked.run_id, follow_again(tracker, tracked, backend, handle, stored, echo=echo)


def stored_config(tracker: Any, run_id: str) -> Config:
    """The resolved config a job's run was logged with."""
    from paiexp.tracking.mlflow_tracker import CONFIG_ARTIFACT

    return to_object(from_yaml(tracker.load_text(run_id, CONFIG_ARTIFACT)))


def follow_again(
    tracker: Any,
    tracked: Any,
    backend: Backend,
    handle: JobHandle,
    stored: Config,
    *,
    echo: Echo | None,
) -> JobResult:
    """Follow a tracked job found again (``tracked``: its open run) to its end and close its
    run: its spec as the run logged it, the metric steps logged already not logged twice."""
    from paiexp.tracking.mlflow_tracker import SPEC_ARTIFACT

    spec = JobSpec.from_dict(json.loads(tracker.load_text(tracked.run_id, SPEC_ARTIFACT)))
    logged = tracker.logged_steps(tracked.run_id)  # flushed by the launcher that died
    return follow(
        backend,
        handle,
        spec,
        tracker,
        tracked.run_id,
        Path(tracked.tags["paiexp.project_dir"]),
        echo=echo,
        logged=logged,
        prices=prices_of(stored.backend),
        direct=bool(stored.tracker.job_uri),
    )


def summarize(
    run_id: str,
    result: JobResult,
    tracker_uri: str,
    experiment_id: str | None = None,
    *,
    log_shown: bool = True,
) -> None:
    """What a person wants to see when a run ends, and where to browse it.  A failed job's
    last log lines (the script's own error) when its log was not shown as it ran (``-q``)."""
    status = result.status
    took = ""
    if status.started_at and status.ended_at:
        took = f" in {status.ended_at - status.started_at:.1f} s"
    say(
        f"job {result.handle.name}: {status.state.value}{took}"
        + (f" ({status.reason})" if status.reason else "")
    )
    if status.state is JobState.FAILED and not log_shown and result.log_tail:
        where = f" ({result.log_path})" if result.log_path else ""
        say(f"  the last lines of its log{where}:")
        for line in result.log_tail[-FAILED_LOG_LINES:]:
            say(f"    {line}")
    for name, value in sorted(result.metrics.items()):
        say(f"  {name} = {value:g}")
    if result.model_uri and status.state is JobState.SUCCEEDED and not result.model_empty:
        say(f"  model: {result.model_uri}")
    if result.cost is not None:
        say(f"  cost: {result.cost.text()}")
    for warning in result.warnings:
        say(f"warning: {warning}")
    say(f"  MLflow run {run_id}")
    for line in browse_lines(tracker_uri, experiment_id, run_id):
        say(f"  {line}")
