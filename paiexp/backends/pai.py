"""PAI backend: each job a PAI training job (PaiStudio TrainingJob API), code and data on OSS.

Built for sweeps, unlike one ``Estimator.fit`` per trial:

- the code is uploaded once per content digest, local inputs likewise;
- one ``ListTrainingJobs`` call per polling tick (by the jobs' common labels) serves every job
  in flight; logs are fetched only every ``log_interval`` seconds, and in full at the end;
- a job is created only after looking it up by its deterministic name, and a create whose
  reply was lost is never repeated blindly (names are not unique on PAI);
- metrics come from the log (client-side regexes) and are cross-checked with the service's
  own (``MetricDefinitions`` applied by PAI), which fill in any the log missed.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from paiexp.backends.base import JobHandle, JobState, JobStatus, LogChunk
from paiexp.backends.checks import (
    check_local_inputs,
    check_positive,
    check_retry,
    local_channels,
)
from paiexp.backends.pai_api import PAGE_SIZE, PaiApi, PaiRejected, running_span
from paiexp.cloud.oss import OssTransfer, OssUri, endpoint_url
from paiexp.config.spec import JobSpec
from paiexp.contract import job_mlflow
from paiexp.contract import layout as contract
from paiexp.errors import UserError
from paiexp.metrics.extraction import METRIC_NAME
from paiexp.util.cache import cache_root
from paiexp.util.retry import RetryPolicy

log = logging.getLogger(__name__)
# One lock per upload (OSS base, kind, local path) in this process: jobs submitted at once, by
# one backend or several (a Hydra multirun's threads), upload the same code or input once.
_UPLOAD_LOCKS: dict[tuple[str, str, str], threading.Lock] = {}
_UPLOAD_LOCKS_LOCK = threading.Lock()

STATES = {
    "Creating": JobState.PENDING,
    "Created": JobState.PENDING,
    "Initializing": JobState.PENDING,
    "Submitted": JobState.PENDING,
    "Queuing": JobState.PENDING,
    "Running": JobState.RUNNING,
    "Stopping": JobState.RUNNING,
    "Restarting": JobState.RUNNING,
    "Succeed": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    "CreateFailed": JobState.FAILED,
    "InitializeFailed": JobState.FAILED,
    "Terminated": JobState.STOPPED,
    "Stopped": JobState.STOPPED,
}
# Failures of the platform rather than of the job's code: a retry may well succeed.
INFRASTRUCTURE_REASONS = ("Spot", "Preempt", "Evict", "NodeFailure", "InstanceReleased")
OUTPUT_PARAMETERS = contract.OUTPUT_PARAMETERS_CHANNEL
CHECKPOINTS = "checkpoints"
NOT_STARTED = "TRAINING_JOB_INSTANCE_NOT_FOUND"  # ListTrainingJobLogs before any instance ran
SDK_MODULES = ("alibabacloud_paistudio20220112", "alibabacloud_credentials", "oss2")


class PaiBackend:
    name = "pai"

    def __init__(self, config: Any, base_dir: Path) -> None:
        """``base_dir``: the project, where copies of the jobs' TensorBoard channels are kept
        (a PAI job keeps nothing else on this machine)."""
        _check_config(config)
        missing = [m for m in SDK_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            raise UserError(f"backend=pai needs {', '.join(missing)}: pip install 'paiexp[pai]'")
        self.config = config
        self.poll_interval = float(config.poll_interval)
        self.log_interval = float(config.log_interval)
        self.oss_base = OssUri(config.oss.bucket, config.oss.prefix.strip("/"))
        self._api: PaiApi | None = None
        self._oss: OssTransfer | None = None
        self._checked = False
        self._uploads: dict[tuple[str, str], str] = {}  # (kind, local path) -> oss:// URI
        self._labels: dict[str, dict[str, str]] = {}  # job id -> its labels
        self._seen: dict[str, dict[str, Any]] = {}  # job id -> last listing of it
        self._details: dict[str, dict[str, Any]] = {}  # job id -> GetTrainingJob once ended
        self._log_reads: dict[str, float] = {}  # job id -> monotonic time of the last read
        self._tensorboard = base_dir / ".paiexp" / "tensorboard"  # a copy per job name
        self._own_stores = base_dir / ".paiexp" / "mlflow-stores"  # a copy per job name
        self._copy_reads: dict[Path, float] = {}  # copy -> monotonic time of the last read

    # -- clients ---------------------------------------------------------------------------

    @property
    def api(self) -> PaiApi:
        if self._api is None:
            self._api = make_api(self.config)
        return self._api

    @property
    def oss(self) -> OssTransfer:
        if self._oss is None:
            self._oss = make_transfer(self.config, self.api.credentials)
        return self._oss

    # -- checks ----------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        if not (spec.image or self.config.image):
            raise UserError(
                "job.image: backend=pai needs a training image; set job.image or backend.image "
                "(official ones: paiexp images --framework XGBoost)"
            )
        if not spec.instance_type:
            raise UserError("job.instance_type: backend=pai needs an ECS spec, e.g. ecs.c6.large")
        check_local_inputs(spec)
        for channel, output in local_channels(spec.outputs).items():
            raise UserError(
                f"job.outputs.{channel}: backend=pai writes outputs to OSS; give an "
                f"oss:// URI or null (default: under {self.oss_base}/), got {output!r}"
            )
        if spec.checkpoints and not spec.checkpoints.startswith("oss://"):
            raise UserError(
                "job.checkpoints: backend=pai starts from an oss:// URI (an earlier job's "
                f"checkpoints channel), got {spec.checkpoints!r}"
            )
        if not self._checked:  # credentials, workspace and bucket, before anything starts
            self.api.list_training_jobs(WorkspaceId=self.config.workspace_id, PageSize=1)
            self._check_bucket()
            self._checked = True

    def _check_bucket(self) -> None:
        import oss2

        try:
            self.oss.list_keys(self.oss_base.as_dir())
        except oss2.exceptions.OssError as exc:
            code = getattr(exc, "code", "") or type(exc).__name__
            raise UserError(
                f"backend.oss.bucket: cannot use oss://{self.oss_base.bucket} at "
                f"{self.oss.endpoint} ({code}); check the bucket, backend.oss.endpoint and the "
                "credentials' OSS permissions"
            ) from None

    def set_concurrency(self, jobs: int) -> None:
        """PAI runs each job on its own instances: nothing to share."""

    # -- submission ------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobHandle:
        existing = self.find(spec.name)
        if existing is not None:
            return existing
        body = self.request_body(spec)
        job_id = self.api.create_training_job(body, lambda: self._find_id(spec.name))
        self._labels[job_id] = dict(spec.labels)
        log.info("created PAI training job %s (%s)", spec.name, job_id)
        return JobHandle(spec.name, job_id)

    def find(self, name: str) -> JobHandle | None:
        job_id = self._find_id(name)
        return None if job_id is None else JobHandle(name, job_id)

    def _find_id(self, name: str) -> str | None:
        """The oldest job with exactly this name (the service's name filter may match more)."""
        jobs, _ = self.api.list_training_jobs(
            WorkspaceId=self.config.workspace_id,
            TrainingJobName=name,
            PageSize=PAGE_SIZE,
            SortBy="GmtCreateTime",
            Order="asc",
        )
        for job in jobs:
            if job.get("TrainingJobName") == name:
                self._remember(job)
                return str(job["TrainingJobId"])
        return None

    def request_body(self, spec: JobSpec) -> dict[str, Any]:
        """The CreateTrainingJob request for ``spec`` (uploading its code and local inputs)."""
        config = self.config
        channels = spec.output_dirs
        algorithm: dict[str, Any] = {
            "Image": spec.image or config.image,
            "Command": ["/bin/sh", "-c", spec.command],
            "JobType": spec.job_type or str(config.job_type),
            "MetricDefinitions": [
                {"Name": d.name, "Regex": d.regex} for d in spec.metric_definitions
            ],
            "OutputChannels": [{"Name": name} for name in channels],
        }
        if spec.source_dir:  # the code's files under a prefix (Key ends in /), as the SDK sends
            code = OssUri.parse(self._upload("code", Path(spec.source_dir)))
            algorithm["CodeDir"] = {
                "LocationType": "oss",
                "LocationValue": {
                    "Bucket": code.bucket,
                    "Key": code.key,
                    "Endpoint": self.oss.endpoint.split("://", 1)[-1],
                },
            }
        labels = {**spec.labels, "paiexp-job": spec.name}
        compute: dict[str, Any] = {"EcsSpec": spec.instance_type, "EcsCount": spec.instance_count}
        if config.spot.strategy:
            compute["UseSpotInstance"] = True
            compute["SpotSpec"] = {"SpotStrategy": str(config.spot.strategy)}
            if config.spot.discount_limit is not None:
                compute["SpotSpec"]["SpotDiscountLimit"] = config.spot.discount_limit
        body: dict[str, Any] = {
            "TrainingJobName": spec.name,
            "WorkspaceId": config.workspace_id,
            "AlgorithmSpec": algorithm,
            "ComputeResource": compute,
            "HyperParameters": [{"Name": k, "Value": v} for k, v in spec.hyperparameters.items()],
            "InputChannels": [
                {"Name": channel, "InputUri": self._input_uri(uri)}
                for channel, uri in spec.inputs.items()
            ],
            "OutputChannels": [
                {"Name": name, "OutputUri": self._output_uri(spec, name)} for name in channels
            ],
            "Labels": [{"Key": k, "Value": v} for k, v in labels.items()],
            "Environments": {
                **spec.environments,
                **job_mlflow.environment(spec.environments, contract.JobLayout()),
            },
        }
        if spec.requirements:
            body["PythonRequirements"] = list(spec.requirements)
        if spec.max_run_time:
            body["Scheduler"] = {"MaxRunningTimeInSeconds": spec.max_run_time}
        if config.vpc.vpc_id:
            vpc = config.vpc
            body["UserVpc"] = {
                "VpcId": vpc.vpc_id,
                "SwitchId": vpc.switch_id,
                "SecurityGroupId": vpc.security_group_id,
                "ExtendedCIDRs": list(vpc.extended_cidrs),
                "DefaultRoute": vpc.default_route,
            }
        return body

    def _upload(self, kind: str, path: Path) -> str:
        key = (kind, str(path))
        with _UPLOAD_LOCKS_LOCK:
            lock = _UPLOAD_LOCKS.setdefault((str(self.oss_base), *key), threading.Lock())
        with lock:
            if key not in self._uploads:
                upload = self.oss.upload_code if kind == "code" else self.oss.upload_input
                self._uploads[key] = str(upload(path, self.oss_base))
            return self._uploads[key]

    def _input_uri(self, uri: str) -> str:
        return uri if uri.startswith("oss://") else self._upload("input", Path(uri))

    def _output_uri(self, spec: JobSpec, channel: str) -> str:
        if channel == CHECKPOINTS and spec.checkpoints:  # the SDK's checkpoints_path
            return str(OssUri.parse(spec.checkpoints).as_dir())
        given = spec.outputs.get(channel)
        if given:
            return str(OssUri.parse(given).join(spec.name, "").as_dir())
        return str(self._default_output(spec.name, channel))

    def _default_output(self, name: str, channel: str) -> OssUri:
        """Where a job's output channel goes on OSS unless ``job.outputs`` says otherwise."""
        return self.oss_base.join("training_job").join(name, channel).as_dir()

    # -- status ----------------------------------------------------------------------------

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        wanted = {h.id for h in handles}
        found: dict[str, dict[str, Any]] = {}
        common = self._common_labels(handles)  # at least the job's own paiexp-job label
        if common:
            page = 1
            while wanted - found.keys():
                jobs, total = self.api.list_training_jobs(
                    WorkspaceId=self.config.workspace_id,
                    Labels=common,
                    PageNumber=page,
                    PageSize=PAGE_SIZE,
                    SortBy="GmtCreateTime",
                    Order="desc",
                )
                found.update((str(j["TrainingJobId"]), j) for j in jobs)
                if page * PAGE_SIZE >= total or not jobs:
                    break
                page += 1
        for job_id in wanted - found.keys():  # labels unknown, or not listed yet
            found[job_id] = self.api.get_training_job(job_id)
        for job_id in wanted:  # which instance failed a multi-instance job: its Instances[]
            job = found[job_id]
            if job.get("Status") == "Failed" and "Instances" not in job and instance_count(job) > 1:
                found[job_id] = self.api.get_training_job(job_id)
        statuses = {}
        for job_id in wanted:
            self._remember(found[job_id])
            statuses[job_id] = status_of(found[job_id])
        return statuses

    def _common_labels(self, handles: Sequence[JobHandle]) -> dict[str, str]:
        label_sets = [self._labels.get(h.id) for h in handles]
        if not label_sets or any(labels is None for labels in label_sets):
            return {}
        common = dict(label_sets[0] or {})
        for labels in label_sets[1:]:
            common = {k: v for k, v in common.items() if (labels or {}).get(k) == v}
        return common

    def _remember(self, job: dict[str, Any]) -> None:
        job_id = str(job["TrainingJobId"])
        self._seen[job_id] = job
        if job.get("Labels") is not None:
            self._labels[job_id] = {
                label["Key"]: label.get("Value", "") for label in job["Labels"] if "Key" in label
            }

    def wait(self, handles: Sequence[JobHandle], timeout: float) -> None:
        time.sleep(timeout)

    def read_logs(self, handle: JobHandle, cursor: int, *, final: bool = False) -> LogChunk:
        now = time.monotonic()
        if not final and now - self._log_reads.get(handle.id, -1e9) < self.log_interval:
            return LogChunk([], cursor)
        self._log_reads[handle.id] = now
        lines: list[str] = []
        page, skip = cursor // PAGE_SIZE + 1, cursor % PAGE_SIZE
        while True:
            try:
                logs, _ = self.api.list_logs(handle.id, page, PAGE_SIZE)
            except PaiRejected as exc:
                if exc.code != NOT_STARTED:
                    raise
                logs = []  # no instance has started yet: no log so far
            lines.extend(line.rstrip("\n") for line in logs[skip:])
            if len(logs) < PAGE_SIZE:
                break
            page, skip = page + 1, 0
        return LogChunk(lines, cursor + len(lines))

    def label(self, handle: JobHandle, labels: Mapping[str, str]) -> None:
        """UpdateTrainingJobLabels, unless the job has those labels already; never raises."""
        known = self._labels.get(handle.id, {})
        if all(known.get(k) == v for k, v in labels.items()):
            return
        try:
            self.api.update_labels(handle.id, labels)
        except Exception as exc:  # rejected, unreachable, credentials gone: labels are extras
            log.warning("could not label %s: %s", handle.name, exc)
            return
        self._labels[handle.id] = {**known, **labels}

    def stop(self, handle: JobHandle) -> None:
        try:
            self.api.stop_training_job(handle.id)
        except PaiRejected as exc:  # e.g. it ended meanwhile
            log.warning("could not stop %s: %s", handle.name, exc)

    # -- results ---------------------------------------------------------------------------

    def detail(self, handle: JobHandle) -> dict[str, Any]:
        """GetTrainingJob, once the job has ended (fetched once, then kept)."""
        if handle.id not in self._details:
            job = self.api.get_training_job(handle.id)
            if not STATES.get(str(job.get("Status")), JobState.RUNNING).terminal:
                return job
            self._details[handle.id] = job
        return self._details[handle.id]

    def outputs(self, handle: JobHandle) -> dict[str, str]:
        job = self._seen.get(handle.id) or self.detail(handle)
        return {
            c["Name"]: c["OutputUri"]
            for c in job.get("OutputChannels") or []
            if c.get("OutputUri") and c.get("Name") not in contract.RESERVED_OUTPUTS
        }

    def output_is_empty(self, handle: JobHandle, channel: str) -> bool:
        uri = self.outputs(handle).get(channel)
        return uri is None or not self.oss.exists_any(OssUri.parse(uri).as_dir())

    def _channel(self, handle: JobHandle, name: str) -> str | None:
        """The OSS URI of one of the job's output channels."""
        job = self._seen.get(handle.id) or self.detail(handle)
        return next(
            (
                c["OutputUri"]
                for c in job.get("OutputChannels") or []
                if c.get("Name") == name and c.get("OutputUri")
            ),
            None,
        )

    def own_mlflow_store(self, handle: JobHandle, scratch: Path | None) -> Path | None:
        """A copy in ``scratch`` of the store the job made in its channel on OSS."""
        if scratch is None:
            return None
        if handle.id in self._seen:
            channel = self._channel(handle, contract.MLFLOW_STORE)
        else:  # where this backend puts it (another process's job: spares a GetTrainingJob)
            channel = str(self._default_output(handle.name, contract.MLFLOW_STORE))
        if channel is None or not self.oss.download(OssUri.parse(channel).as_dir(), scratch):
            return None
        store = scratch / contract.JobLayout().mlflow_store.name
        return store if store.is_dir() else None

    def output_parameters(self, handle: JobHandle) -> dict[str, float]:
        channel = self._channel(handle, OUTPUT_PARAMETERS)
        if channel is None:
            return {}
        prefix = OssUri.parse(channel).as_dir()
        values: dict[str, float] = {}
        for key in self.oss.list_keys(prefix):
            name = key[len(prefix.key) :]
            if not METRIC_NAME.match(name):
                continue
            text = self.oss.get_bytes(OssUri(prefix.bucket, key)).decode(errors="replace")
            try:
                values[name] = float(text.strip())
            except ValueError:
                continue
        return values

    def service_metrics(self, handle: JobHandle) -> dict[str, float]:
        """The latest value of each metric as PAI computed it from ``MetricDefinitions``."""
        return {
            m["Name"]: float(m["Value"])
            for m in self.detail(handle).get("LatestMetrics") or []
            if m.get("Name") and m.get("Value") is not None
        }

    def tensorboard_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        """The channel's copy here, its new bytes fetched at most every ``log_interval``."""
        uri = self.outputs(handle).get("tensorboard")
        if uri is None:
            return None
        return self._growing_copy(uri, self._tensorboard / handle.name, final)

    def own_mlflow_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        """A copy here of what the store holds that is read as the job runs
        (:func:`job_mlflow.watched`), its new bytes fetched at most every ``log_interval``."""
        channel = self._channel(handle, contract.MLFLOW_STORE)
        if channel is None:
            return None
        store = OssUri.parse(channel).join(contract.JobLayout().mlflow_store.name)
        copy = self._own_stores / handle.name
        return self._growing_copy(str(store), copy, final, job_mlflow.watched)

    def _growing_copy(
        self, uri: str, local: Path, final: bool, wanted: Callable[[str], bool] | None = None
    ) -> Path | None:
        """``local`` brought up to the files under ``uri`` that only grow (event and metric
        files; ``wanted``: those of them it says yes to, by path under ``uri``), when ``final``
        or ``log_interval`` after it was last."""
        now = time.monotonic()
        if final or now - self._copy_reads.get(local, -1e9) >= self.log_interval:
            self._copy_reads[local] = now
            self.oss.mirror_growing(OssUri.parse(uri), local, wanted)
        return local if local.is_dir() else None

    def console_url(self, handle: JobHandle) -> str | None:
        url = self.detail(handle).get("TrainingJobUrl")
        return str(url) if url else None

    def instance_logs(self, handle: JobHandle) -> dict[str, Path]:
        """Each instance's log (ListTrainingJobLogs by WorkerId), kept in the cache."""
        instances = self.detail(handle).get("Instances") or []
        if len(instances) < 2:
            return {}
        directory = cache_root() / "pai-logs" / handle.id
        directory.mkdir(parents=True, exist_ok=True)
        logs = {}
        for instance in instances:
            lines: list[str] = []
            page = 1
            while True:
                chunk, _ = self.api.list_logs(handle.id, page, PAGE_SIZE, str(instance["Name"]))
                lines.extend(line.rstrip("\n") + "\n" for line in chunk)
                if len(chunk) < PAGE_SIZE:
                    break
                page += 1
            path = directory / f"{instance_name(instance)}.log"
            path.write_text("".join(lines))
            logs[instance_name(instance)] = path
        return logs


def retry_policy(config: Any) -> RetryPolicy:
    return RetryPolicy(config.retry.attempts, config.retry.base_delay, config.retry.max_delay)


def make_api(config: Any) -> PaiApi:
    """The PAI API client a ``backend=pai`` config describes (credentials from the chain)."""
    from paiexp.cloud.credentials import credential_client

    return PaiApi(
        region=config.region,
        endpoint=config.endpoint,
        workspace_endpoint=config.workspace_endpoint,
        protocol=str(config.protocol),
        credentials=credential_client(),
        policy=retry_policy(config),
        timeout=config.request_timeout,
    )


def make_transfer(config: Any, credentials: Any) -> OssTransfer:
    """OSS transfers for a ``backend=pai`` config's bucket and endpoint."""
    return OssTransfer(
        endpoint_url(config.oss.endpoint, config.region),
        config.region,
        credentials,
        cache_root() / "oss",
        retry_policy(config),
        config.request_timeout,
    )


def status_of(job: dict[str, Any]) -> JobStatus:
    """A PAI job's Status (and ReasonCode/ReasonMessage) as a JobStatus."""
    status = str(job.get("Status") or "")
    state = STATES.get(status)
    if state is None:
        log.debug("unknown PAI status %r taken as running", status)
        state = JobState.RUNNING
    reason = None
    if state in (JobState.FAILED, JobState.STOPPED):
        detail = ": ".join(str(p) for p in (job.get("ReasonCode"), job.get("ReasonMessage")) if p)
        reason = f"PAI {status}" + (f" ({detail})" if detail else "")
        failed = [i for i in job.get("Instances") or [] if i.get("Status") == "Failed"]
        if failed and instance_count(job) > 1:
            reason = f"{instance_name(failed[0])} failed: {reason}"
    code = str(job.get("ReasonCode") or "")
    started, ended = running_span(job)
    return JobStatus(
        state=state,
        reason=reason,
        started_at=started,
        ended_at=ended if state.terminal else None,
        infrastructure=state is JobState.FAILED and any(r in code for r in INFRASTRUCTURE_REASONS),
    )


def instance_count(job: dict[str, Any]) -> int:
    return int((job.get("ComputeResource") or {}).get("EcsCount") or 1)


def instance_name(instance: Mapping[str, Any]) -> str:
    """An instance as paiexp names it, DLC's name without the job's prefix: ``master-0``
    for ``dlc1a2b3c-master-0``."""
    return "-".join(str(instance["Name"]).rsplit("-", 2)[-2:])


def _check_config(config: Any) -> None:
    """Every mistake in ``backend`` found before any client is built or request sent."""
    if not config.workspace_id:
        raise UserError(
            "backend.workspace_id: required for backend=pai (the PAI workspace's ID, e.g. 12345)"
        )
    if not config.oss.bucket:
        raise UserError(
            "backend.oss.bucket: required for backend=pai (the OSS bucket for code and outputs)"
        )
    check_positive(config, "poll_interval", "log_interval", "request_timeout")
    check_retry(config.retry)
