"""OpenPAI backend: each job an OpenPAI job (REST API v2), its files on the cluster's storage.

- The job protocol v2 (:mod:`paiexp.backends.openpai_job`): one task role of
  ``job.instance_count`` instances with the CPUs, memory and GPUs of ``job.instance_type``,
  commands that lay out the PAI contract, the storage config mounted by ``teamwise_storage``.
- Submission is idempotent by the job's deterministic name: a 409 is the existing job, also
  when a retried POST's first reply was lost.
- One listing of the user's jobs (``GET /api/v2/jobs?username=...``, narrowed by the names'
  common prefix) per polling tick serves every job in flight; a job that ended failing is
  fetched once more, for its exit diagnostics, the failure reason.
- Logs come from the log-location API, read every ``log_interval`` seconds while a job runs
  (in full once it ended) from a cursor; stop is ``PUT .../executionType {"value": "STOP"}``.
- A job of several instances is a task role of that many tasks (task ``i`` is rank ``i``):
  the job's log (its metrics) is task 0's, the master's; once it ended each task's log is
  fetched to ``<job>/logs/<instance>.log``; a failed task fails the job, its reason naming the
  instance (the completion policy's trigger) with its exit code and last log line.
- Outputs, ``output_parameters`` and the model are read from the storage, as files here.
"""

from __future__ import annotations

import logging
import math
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from paiexp.backends.base import JobHandle, JobRejected, JobState, JobStatus, LogChunk
from paiexp.backends.checks import (
    check_local_inputs,
    check_positive,
    check_retry,
    install_mode,
    oss_channels,
)
from paiexp.backends.instance_types import Resources, resolve
from paiexp.backends.jobdir import JobDirectories, LocalResults
from paiexp.backends.openpai_api import OpenPaiApi, OpenPaiRejected
from paiexp.backends.openpai_cluster import resolve_cluster
from paiexp.backends.openpai_job import ROLE, STATE_DIR, Storage, protocol, stage_input
from paiexp.config.spec import JobSpec
from paiexp.contract.distributed import Topology, job_type
from paiexp.errors import UserError
from paiexp.util.retry import RetryPolicy

log = logging.getLogger(__name__)

STATES = {
    "WAITING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "STOPPING": JobState.RUNNING,
    "STOPPED": JobState.STOPPED,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "UNKNOWN": JobState.RUNNING,  # the framework's state is not known yet: ask again
}
# appExitSpec types of failures of the platform rather than the job's: worth a retry.
INFRASTRUCTURE_TYPES = ("PLATFORM_FAILURE", "RESOURCE_ALLOCATION_TIMEOUT")
LOG_NAMES = ("all", "stdout")  # stdout and stderr interleaved, else stdout alone
ATTEMPT_SHIFT = 40  # a log cursor: the job attempt above these bits, a byte offset below
LISTING_GRACE = 60.0  # seconds a job just submitted may take to be listed
INSTANCE_LOGS = "logs"  # in a job's directory: each task's log, once the job ended


class OpenPaiBackend(LocalResults):
    name = "openpai"

    def __init__(self, config: Any, base_dir: Path) -> None:
        _check_config(config)
        self.config = config
        self.install_requirements = install_mode(config.install_requirements)
        resolve(None, config.cpus, config.memory, config.gpus, backend=self.name)  # overrides
        self.cluster = resolve_cluster(config)
        self.storage = _storage(config, base_dir)
        self.jobs = JobDirectories(self.storage.root / "jobs")
        self.poll_interval = float(config.poll_interval)
        self.log_interval = float(config.log_interval)
        policy = RetryPolicy(config.retry.attempts, config.retry.base_delay, config.retry.max_delay)
        self.api = OpenPaiApi(self.cluster, policy, float(config.request_timeout))
        self._checked = False
        self._staged: dict[str, Path] = {}  # local input -> its copy on the storage
        self._seen: dict[str, dict[str, Any]] = {}  # job id -> its latest jobStatus
        self._details: dict[str, dict[str, Any]] = {}  # job id -> its detail, once ended
        self._submitted: dict[str, float] = {}  # job id -> when this backend created it
        self._log_reads: dict[str, float] = {}  # job id -> when its log was last read
        self._log_uris: dict[tuple[str, int, int], str] = {}  # (job id, attempt, task) -> URI

    def _id(self, name: str) -> str:
        """The job's framework name on the cluster: ``{user}~{name}``."""
        return f"{self.cluster.user}~{name}"

    # -- checks ----------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        self._image(spec)
        self._resources(spec)
        for channel, uri in oss_channels(spec.inputs).items():
            raise UserError(
                f"job.inputs.{channel}: backend=openpai reads local paths (staged on its "
                f"storage), got {uri!r}"
            )
        check_local_inputs(spec)
        for channel, destination in spec.outputs.items():
            if destination and (
                destination.startswith("oss://") or not self.storage.holds(Path(destination))
            ):
                raise UserError(
                    f"job.outputs.{channel}: backend=openpai writes outputs to its storage: give "
                    f"a path under backend.storage.local_path ({self.storage.local}) or null, "
                    f"got {destination!r}"
                )
        if not self._checked:  # the token, storage config and virtual cluster, once
            self._check_cluster()
            self._checked = True

    def _check_cluster(self) -> None:
        storages = self.api.storages()  # a refused token is one line naming OPENPAI_TOKEN
        if self.storage.name not in storages:
            raise UserError(
                f"backend.storage.name: the cluster has no storage config "
                f"{self.storage.name!r} for user {self.cluster.user!r}; it has: "
                f"{', '.join(storages) or 'none'}"
            )
        clusters = self.api.virtual_clusters()
        if self.config.virtual_cluster not in clusters:
            raise UserError(
                f"backend.virtual_cluster: unknown virtual cluster "
                f"{self.config.virtual_cluster!r}; the cluster has: {', '.join(clusters)}"
            )

    def _image(self, spec: JobSpec) -> str:
        image = self.config.image or spec.image
        if not image:
            raise UserError(
                "job.image: backend=openpai needs the docker image its tasks run; set "
                "job.image, or backend.image"
            )
        return str(image)

    def _resources(self, spec: JobSpec) -> Resources:
        config = self.config
        resources = resolve(
            spec.instance_type, config.cpus, config.memory, config.gpus, backend=self.name
        )
        if resources.cpus is None or resources.memory is None:
            raise UserError(
                "job.instance_type: backend=openpai needs each instance's CPUs and memory; "
                "set job.instance_type (e.g. ecs.c6.large), or backend.cpus and backend.memory"
            )
        return resources

    def set_concurrency(self, jobs: int) -> None:
        """The cluster runs each job on its own resources: nothing to share."""

    # -- submission ------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobHandle:
        try:
            image, resources = self._image(spec), self._resources(spec)
        except UserError as exc:  # a swept value (instance type, image) it cannot run
            raise JobRejected(str(exc)) from None
        inputs = {channel: self._stage(Path(path)) for channel, path in spec.inputs.items()}
        if not self.jobs.exists(spec.name):
            for destination in filter(None, spec.outputs.values()):
                Path(destination).mkdir(parents=True, exist_ok=True)
            self.jobs.create(spec, lambda staging: (staging / STATE_DIR).mkdir())
        job = protocol(
            spec,
            storage=self.storage,
            job_dir=self.jobs.path(spec.name),
            inputs=inputs,
            image=image,
            resources=resources,
            virtual_cluster=self.config.virtual_cluster,
            job_retry_count=self.config.job_retry_count,
            install_mode=self.install_requirements,
        )
        job_id = self._id(spec.name)
        if self.api.submit(yaml.safe_dump(job, sort_keys=False)):
            self._submitted[job_id] = time.monotonic()
            log.info("submitted OpenPAI job %s", job_id)
        return JobHandle(spec.name, job_id)

    def _stage(self, path: Path) -> Path:
        key = str(path)
        if key not in self._staged:
            self._staged[key] = stage_input(self.storage, path)
        return self._staged[key]

    def find(self, name: str) -> JobHandle | None:
        detail = self.api.get_job(self._id(name))
        if detail is None:
            return None
        self._remember(self._id(name), detail)
        return JobHandle(name, self._id(name))

    # -- status ----------------------------------------------------------------------------

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """Every job's status from one listing (a job not listed yet: its own request)."""
        if not handles:
            return {}
        keyword = common_prefix([h.name for h in handles])
        listed = {
            f"{job.get('username') or self.cluster.user}~{job.get('name')}": job
            for job in self.api.list_jobs(keyword)
        }
        self._seen.update(listed)
        return {handle.id: self._status(handle, listed.get(handle.id)) for handle in handles}

    def _status(self, handle: JobHandle, job: dict[str, Any] | None) -> JobStatus:
        if job is None and self.find(handle.name) is not None:
            job = self._seen[handle.id]
        if job is None:
            if time.monotonic() - self._submitted.get(handle.id, -math.inf) < LISTING_GRACE:
                return JobStatus(JobState.PENDING)
            return JobStatus(
                JobState.FAILED, "the job is not on the OpenPAI cluster", infrastructure=True
            )
        state = STATES.get(str(job.get("state")), JobState.RUNNING)
        reason, infrastructure = None, False
        if state is JobState.FAILED:
            reason, infrastructure = self._failure(handle)
        elif state is JobState.STOPPED:
            reason = "stopped"
        return JobStatus(
            state,
            reason,
            exit_code=job.get("appExitCode"),
            started_at=_seconds(job.get("createdTime")),
            ended_at=_seconds(job.get("completedTime")) if state.terminal else None,
            infrastructure=infrastructure,
        )

    def _remember(self, job_id: str, detail: dict[str, Any]) -> None:
        status = dict(detail.get("jobStatus") or {})
        self._seen[job_id] = status
        if STATES.get(str(status.get("state")), JobState.RUNNING).terminal:
            self._details[job_id] = detail

    def _failure(self, handle: JobHandle) -> tuple[str, bool]:
        """Why a job failed: the entry script's note on the storage (requirements, timeout),
        else OpenPAI's exit code, phrase and diagnostics; and whether the platform failed."""
        note = self.jobs.path(handle.name) / STATE_DIR / "failure"
        if note.is_file():
            return note.read_text().strip(), False
        if handle.id not in self._details:
            detail = self.api.get_job(handle.id)
            if detail is not None:
                self._remember(handle.id, detail)
        detail = self._details.get(handle.id) or {}
        status = detail.get("jobStatus") or {}
        exit_spec = status.get("appExitSpec") or {}
        infrastructure = exit_spec.get("type") in INFRASTRUCTURE_TYPES
        task = status.get("appExitTriggerTaskIndex")
        topology = self._topology(handle.name)
        if topology.count > 1 and task is not None:  # the task whose failure failed the job
            return self._task_failure(handle, detail, topology, int(task)), infrastructure
        what = ", ".join(
            str(part)
            for part in (f"exit code {status.get('appExitCode')}", exit_spec.get("phrase"))
            if part
        )
        diagnostics = str(
            status.get("appExitDiagnostics") or status.get("appExitTriggerMessage") or ""
        ).strip()
        reason = f"OpenPAI FAILED ({what})" + (
            f": {diagnostics.splitlines()[0][:300]}" if diagnostics else ""
        )
        return reason, infrastructure

    def _task_failure(
        self, handle: JobHandle, detail: dict[str, Any], topology: Topology, task: int
    ) -> str:
        """The reason of a job a failed task failed: the instance, its exit code, its last
        log line."""
        tasks = ((detail.get("taskRoles") or {}).get(ROLE) or {}).get("taskStatuses") or []
        code = next((t.get("containerExitCode") for t in tasks if t.get("taskIndex") == task), None)
        attempt = int((detail.get("jobStatus") or {}).get("retries") or 0)
        lines = self._log(handle, attempt, task).decode("utf-8", errors="replace").splitlines()
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        return f"{topology.name(task)} exited with code {code}" + (
            f": {last[:300]}" if last else ""
        )

    def _topology(self, name: str) -> Topology:
        """The job's instances, from its spec on the storage."""
        spec = self.jobs.load_spec(name)
        return Topology(spec.instance_count, job_type(spec.job_type))

    def wait(self, handles: Sequence[JobHandle], timeout: float) -> None:
        time.sleep(timeout)

    # -- logs, stop, labels ----------------------------------------------------------------

    def read_logs(self, handle: JobHandle, cursor: int, *, final: bool = False) -> LogChunk:
        now = time.monotonic()
        if not final and now - self._log_reads.get(handle.id, -math.inf) < self.log_interval:
            return LogChunk([], cursor)
        self._log_reads[handle.id] = now
        job = self._seen.get(handle.id)
        if job is None and self.find(handle.name) is None:
            return LogChunk([], cursor)
        attempt = int((job or self._seen[handle.id]).get("retries") or 0)
        read_attempt, offset = divmod(cursor, 1 << ATTEMPT_SHIFT)
        if read_attempt != attempt:
            offset = 0  # OpenPAI retried the job: its new attempt's log from the start
        data = self._log(handle, attempt)[offset:]
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        lines = data.decode("utf-8", errors="replace").splitlines()
        return LogChunk(lines, (attempt << ATTEMPT_SHIFT) + offset + len(data))

    def _log(self, handle: JobHandle, attempt: int, task: int = 0) -> bytes:
        """The log of the job's task ``task`` (0: the master's) in ``attempt``, read from its
        location (found again once if it stopped answering: log locations carry tokens that
        expire)."""
        key = (handle.id, attempt, task)
        for _ in range(2):
            if key not in self._log_uris:
                locations = self.api.log_locations(handle.id, attempt, ROLE, task)
                uri = next((locations[n] for n in LOG_NAMES if n in locations), None)
                if uri is None:
                    return b""  # the task has not started
                self._log_uris[key] = uri
            try:
                return self.api.read_log(self._log_uris[key])
            except OpenPaiRejected:
                del self._log_uris[key]
        return b""

    def instance_logs(self, handle: JobHandle) -> dict[str, Path]:
        """Each task's log of an ended job of several instances, fetched here by instance name
        (an empty file for a task that never started); {} for a job of one."""
        topology = self._topology(handle.name)
        if topology.count == 1:
            return {}
        job = self._seen.get(handle.id)
        if job is None and self.find(handle.name) is None:
            return {}
        attempt = int((job or self._seen[handle.id]).get("retries") or 0)
        directory = self.jobs.path(handle.name) / INSTANCE_LOGS
        directory.mkdir(exist_ok=True)
        logs = {}
        for task, name in enumerate(topology.names):
            logs[name] = directory / f"{name}.log"
            logs[name].write_bytes(self._log(handle, attempt, task))
        return logs

    def label(self, handle: JobHandle, labels: Mapping[str, str]) -> None:
        """OpenPAI jobs carry no labels paiexp could add: nothing to do."""

    def stop(self, handle: JobHandle) -> None:
        try:
            self.api.stop(handle.id)
        except OpenPaiRejected as exc:  # e.g. it is gone
            log.warning("could not stop %s: %s", handle.name, exc)

    # -- results: outputs, output_parameters, output_is_empty from the storage (LocalResults)

    def console_url(self, handle: JobHandle) -> str | None:
        query = urllib.parse.urlencode({"username": self.cluster.user, "jobName": handle.name})
        return f"{self.cluster.web_portal_uri}/job-detail.html?{query}"


def _check_config(config: Any) -> None:
    """Mistakes in ``backend`` found before any request is sent."""
    check_positive(config, "poll_interval", "log_interval", "request_timeout")
    check_retry(config.retry)
    if config.job_retry_count < 0:
        raise UserError(f"backend.job_retry_count: must be >= 0, got {config.job_retry_count}")


def _storage(config: Any, base_dir: Path) -> Storage:
    if not config.storage.name:
        raise UserError(
            "backend.storage.name: required for backend=openpai (OpenPAI manages no storage: "
            "a storage config of the cluster, mounted in jobs at /mnt/<name>)"
        )
    if not config.storage.local_path:
        raise UserError(
            f"backend.storage.local_path: required for backend=openpai (where this machine "
            f"mounts storage config {config.storage.name!r}: code and inputs are staged there, "
            "outputs read back)"
        )
    local = (base_dir / config.storage.local_path).resolve()
    if not local.is_dir():
        raise UserError(
            f"backend.storage.local_path: {config.storage.local_path!r} is not a directory "
            f"(looked at {local}); mount storage config {config.storage.name!r} there"
        )
    return Storage(str(config.storage.name), local, config.storage.prefix.strip("/"))


def common_prefix(names: Sequence[str]) -> str:
    """The longest string every name starts with (a sweep's jobs share their study's)."""
    first, last = min(names), max(names)
    length = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), None)
    return first if length is None else first[:length]


def _seconds(milliseconds: Any) -> float | None:
    return float(milliseconds) / 1000 if milliseconds else None
