"""The emulated PAI control plane, spoken over real HTTP so the official generated clients run.

Two APIs share one server: PaiStudio 2022-01-12 (TrainingJob: create, get, list, stop, logs,
metrics) and AIWorkspace 2021-02-04 ``ListImages``.  Requests must carry one of the two
signatures PAI accepts, recomputed with the account's secret: ``ACS3-HMAC-SHA256`` (what
``alibabacloud-tea-openapi`` sends by default) or the older ROA ``acs <AccessKeyId>:<signature>``
(HMAC-SHA1, what the official PAI Python SDK sends: tea-openapi ``signature_algorithm="v2"``).

A training job is run for real: a background thread walks it through Creating -> Created ->
Initializing -> Submitted -> Running -> Succeed/Failed/Terminated (the order of
``TrainingJobStatus`` in the PAI SDK), fetches its code and inputs from the object store into
``<root>/jobs/<id>/ml`` (the PAI ``/ml`` tree, with ``code`` the same directory as
``usercode``), runs the command, extracts metrics from the log with ``MetricDefinitions`` and
pushes ``ml/output/<channel>/`` to each channel's ``OutputUri`` before the final status is set.
Given ``local_images`` (PAI image URI, or ``default``, -> local Docker image), the command runs
in a container of that image with that tree at ``/ml``, as on PAI (see runners.py); without,
on the host with the host interpreter first on ``PATH`` and the tree where it is (a fast mode
for tests of the API alone). The ``PAI_*`` variables are those of ``paiexp.contract.layout``.
StopTrainingJob moves a job to ``Stopping`` while its process is being stopped (at least one
phase), then to ``Terminated``.

An output channel's ``OutputUri`` is mounted on PAI: what is there already (an earlier job's
checkpoints, which the SDK's ``checkpoints_path`` names) is in ``ml/output/<channel>`` when the
command starts, and what the command writes there reaches OSS as it runs (the mount writes a
changed file through every ``MOUNT_SYNC_SECONDS``; a TensorBoard on the channel sees it grow).
:meth:`PaiServer.reclaim` takes a running spot job's instances back as PAI
does: its command is killed and the job ends ``Failed`` with ``RECLAIM_CODE`` (PAI's docs:
"After preemptible resources are released, DLC jobs fail and stop running"; no status of its
own, and the TrainingJob API documents no reason code for it: the code is the emulator's
choice, worded from those docs, and holds the ``Spot`` paiexp's PAI backend classifies by).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import importlib.metadata
import io
import json
import os
import queue
import re
import secrets
import shlex
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from packaging.requirements import InvalidRequirement, Requirement

from paiexp.backends import mlroot
from paiexp.contract import layout as contract

from .common import Credentials, Fault, FaultPlan, RequestLog, RequestRecord
from .http_server import ServiceHttpServer
from .runners import (
    JOB_LABEL,
    ContainerEngine,
    HostProcess,
    Instance,
    InstanceGroup,
    Running,
    entry_script,
)
from .store import ObjectStore, split_uri

# ECS instance types PAI-DLC sells in cn-hangzhou (CPU and GPU); anything else is rejected.
DEFAULT_INSTANCE_TYPES: tuple[str, ...] = (
    "ecs.c6.large",
    "ecs.c6.xlarge",
    "ecs.c6.2xlarge",
    "ecs.c6.4xlarge",
    "ecs.g6.large",
    "ecs.g6.xlarge",
    "ecs.g6.2xlarge",
    "ecs.g6.4xlarge",
    "ecs.r6.xlarge",
    "ecs.c7.xlarge",
    "ecs.g7.xlarge",
    "ecs.g7.2xlarge",
    "ecs.gn6i-c4g1.xlarge",
    "ecs.gn6i-c8g1.2xlarge",
    "ecs.gn6v-c8g1.2xlarge",
    "ecs.gn7i-c8g1.2xlarge",
)

# Official PAI training images: (name, system.framework, system.chipType, system.pythonVersion).
OFFICIAL_IMAGES: tuple[tuple[str, str, str, str], ...] = (
    ("xgboost-training:1.6.0-cpu-py36-ubuntu18.04", "XGBoost 1.6.0", "CPU", "3.6"),
    ("pytorch-training:1.12-cpu-py39-ubuntu20.04", "PyTorch 1.12", "CPU", "3.9"),
    ("pytorch-training:1.12-gpu-py39-cu113-ubuntu20.04", "PyTorch 1.12", "GPU", "3.9"),
    ("pytorch-training:2.7-gpu-py312-cu128-ubuntu24.04", "PyTorch 2.7", "GPU", "3.12"),
    ("tensorflow-training:2.3-cpu-py36-ubuntu18.04", "TensorFlow 2.3", "CPU", "3.6"),
    ("tensorflow-training:2.3-gpu-py36-cu101-ubuntu18.04", "TensorFlow 2.3", "GPU", "3.6"),
)

TERMINAL = frozenset({"Succeed", "Failed", "Terminated", "InitializeFailed", "CreateFailed"})
ALGORITHM = "ACS3-HMAC-SHA256"
ROA_SCHEME = "acs"  # Authorization: acs <AccessKeyId>:<base64 HMAC-SHA1>
ROA_METHOD = "HMAC-SHA1"
CLOCK_SKEW_SECONDS = 15 * 60
KILL_GRACE_SECONDS = 1.0
MOUNT_SYNC_SECONDS = 0.5  # how often a mounted output channel writes changed files through
RECLAIM_CODE = "SpotInstanceReleased"
RECLAIM_MESSAGE = (
    "The preemptible (spot) instances of the job were released (reclaimed by the market "
    "price or stock); the job failed and stopped running."
)
MASTER_PORT = 23456  # DLC's
ACCOUNT_UID = "1605338126478013"
# What a job inherits from the emulator's environment (no credentials, no host PYTHONPATH).
HOST_ENV = re.compile(r"PATH|HOME|USER|LANG|LANGUAGE|LC_\w+|TZ|TMPDIR|PIP_\w+|(?i:\w+_proxy)")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
PAGE_SIZE = 20  # ListImages documents 20 as its default; assumed for the others too
# Keys the ListTrainingJobs items carry (ListTrainingJobsResponseBodyTrainingJobs).
LIST_KEYS = frozenset(
    {
        "AlgorithmName", "AlgorithmProvider", "AlgorithmVersion", "ComputeResource", "DlcJobId",
        "Environments", "ExperimentConfig", "GmtCreateTime", "GmtModifiedTime", "HyperParameters",
        "InputChannels", "IsTempAlgo", "Labels", "OutputChannels", "PythonRequirements",
        "ReasonCode", "ReasonMessage", "RoleArn", "Scheduler", "Status", "StatusTransitions",
        "TrainingJobDescription", "TrainingJobId", "TrainingJobName", "UserId", "UserVpc",
        "WorkspaceId",
    }
)  # fmt: skip
# Request fields echoed unchanged by GetTrainingJob.
ECHOED = (
    "AlgorithmName", "AlgorithmProvider", "AlgorithmVersion", "AlgorithmSpec", "Environments",
    "ExperimentConfig", "HyperParameters", "InputChannels", "Labels", "OutputChannels",
    "Priority", "PythonRequirements", "RoleArn", "Scheduler", "Settings",
    "TrainingJobDescription", "UserVpc",
)  # fmt: skip


class ApiError(Exception):
    """An error response: HTTP status, Alibaba Cloud error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass
class _Job:
    id: str
    request: dict[str, Any]
    created: float
    seq: int
    dir: Path
    metric_regexes: list[tuple[str, re.Pattern[str]]]
    dlc_id: str = field(default_factory=lambda: "dlc" + _random_id(14))
    status: str = "Creating"
    modified: float = 0.0
    transitions: list[dict[str, str]] = field(default_factory=list)
    reason_code: str | None = None
    reason_message: str | None = None
    run_start: float | None = None
    end: float | None = None
    logs: list[tuple[float, str]] = field(default_factory=list)
    metrics: list[tuple[str, float, float]] = field(default_factory=list)
    running: Running | InstanceGroup | None = None  # its command(s), while they run
    instances: list[_Instance] = field(default_factory=list)  # of a multi-instance job
    stop_reason: str | None = None  # "user", "timeout" or "shutdown"
    stopping_since: float | None = None  # when StopTrainingJob set Stopping
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def ml(self) -> Path:
        return self.dir / "ml"


@dataclass
class _Instance:
    """One instance of a multi-instance job, as GetTrainingJob's Instances[] shows it."""

    name: str  # DLC's: <dlc id>-master-0, <dlc id>-worker-0, ... (its host name)
    role: str  # Master or Worker
    status: str = "Running"
    logs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: re.Pattern[str]
    action: str
    product: str  # for the error's HostId / Recommend link
    handler: Callable[..., dict[str, Any]]


class PaiServer:
    """PAI TrainingJob + ListImages on ``http://host:port``; ``endpoint`` is ``host:port``."""

    def __init__(
        self,
        store: ObjectStore,
        credentials: Credentials,
        log: RequestLog,
        faults: FaultPlan | None = None,
        root: Path | None = None,
        phase_seconds: float = 0.05,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        region: str = "cn-hangzhou",
        instance_types: Iterable[str] = DEFAULT_INSTANCE_TYPES,
        image_allow: str | None = None,
        local_images: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.credentials = credentials
        self.log = log
        self.faults = faults
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="pai-emulator-"))
        self.phase_seconds = phase_seconds
        # Jobs go on to Submitted (and run) only while this is set: a test clears it to hold
        # new jobs before they run (a stop still ends them).
        self.admit = threading.Event()
        self.admit.set()
        self.region = region
        self.instance_types = frozenset(instance_types)
        self.image_allow = re.compile(image_allow) if image_allow else None
        self.images = _official_images(region)
        self.engine = (
            ContainerEngine(local_images, self.root, KILL_GRACE_SECONDS) if local_images else None
        )
        self._host, self._port = host, port
        self._lock = threading.RLock()
        self._jobs: dict[str, _Job] = {}
        self._nonces: dict[str, float] = {}
        self._errors = 0
        self._httpd: _HttpServer | None = None
        self._routes = self._build_routes()

    # lifecycle -------------------------------------------------------------------------
    def start(self) -> PaiServer:
        self._httpd = _HttpServer((self._host, self._port), self)
        threading.Thread(target=self._httpd.serve_forever, name="pai-emulator", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and kill every job still running (they end Terminated)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self._interrupt(job, "shutdown")
        for job in jobs:
            if job.thread:
                job.thread.join(timeout=KILL_GRACE_SECONDS + 5)
        if self.engine:
            self.engine.remove_all()
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd.close_connections()
            self._httpd = None

    def __enter__(self) -> PaiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if not self._httpd:
            raise RuntimeError("the PAI emulator is not running")
        return int(self._httpd.server_address[1])

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``: what ``Config(endpoint=..., protocol="http")`` takes."""
        return f"{self._host}:{self.port}"

    def job_dir(self, training_job_id: str) -> Path:
        """Where a job's ``ml`` tree, ``job.log`` and ``job.json`` live."""
        return self.root / "jobs" / training_job_id

    def jobs(self) -> list[dict[str, Any]]:
        """Every job as GetTrainingJob shows it, oldest first (for test assertions)."""
        with self._lock:
            return [json.loads(json.dumps(self._view(job))) for job in self._jobs.values()]

    def job(self, training_job_id: str) -> dict[str, Any]:
        """One job as GetTrainingJob shows it; KeyError when there is none."""
        with self._lock:
            return json.loads(json.dumps(self._view(self._jobs[training_job_id])))

    def containers(self) -> list[dict[str, Any]]:
        """The job containers this emulator has in the engine now."""
        return self.engine.containers() if self.engine else []

    def leaked_containers(self) -> list[dict[str, Any]]:
        """Containers of jobs that have ended: none, unless the emulator leaks them (a job's
        container is removed before its final status is set)."""
        with self._lock:
            ended = {job.id for job in self._jobs.values() if job.status in TERMINAL}
        return [c for c in self.containers() if c["Labels"].get(JOB_LABEL) in ended]

    def reclaim(self, training_job_id: str) -> None:
        """Take a running spot job's instances back: it ends Failed (``RECLAIM_CODE``).
        ValueError for a job without ``SpotSpec`` or one not running: PAI reclaims neither."""
        with self._lock:
            job = self._jobs[training_job_id]
            if not (job.request.get("ComputeResource") or {}).get("SpotSpec"):
                raise ValueError(f"{training_job_id} is no spot job: nothing to reclaim")
            if job.status != "Running":
                raise ValueError(f"{training_job_id} is {job.status}, not Running")
        self._interrupt(job, "reclaim")

    # HTTP plumbing ---------------------------------------------------------------------
    def _build_routes(self) -> list[_Route]:
        job = r"/api/v1/trainingjobs/(?P<job>[^/]+)"
        table: list[tuple[str, str, str, str, Callable[..., dict[str, Any]]]] = [
            ("POST", r"/api/v1/trainingjobs", "CreateTrainingJob", "PAI", self._create_job),
            ("GET", r"/api/v1/trainingjobs", "ListTrainingJobs", "PAI", self._list_jobs),
            ("GET", job, "GetTrainingJob", "PAI", self._get_job),
            ("PUT", job + "/stop", "StopTrainingJob", "PAI", self._stop_job),
            ("POST", job + "/labels", "UpdateTrainingJobLabels", "PAI", self._update_labels),
            ("GET", job + "/logs", "ListTrainingJobLogs", "PAI", self._list_logs),
            ("GET", job + "/metrics", "ListTrainingJobMetrics", "PAI", self._list_metrics),
            ("GET", job + "/latestmetrics", "GetTrainingJobLatestMetrics", "PAI", self._latest),
            ("GET", r"/api/v1/images", "ListImages", "AIWorkSpace", self._list_images),
        ]
        return [_Route(m, re.compile(p + "/?"), a, pr, h) for m, p, a, pr, h in table]

    def _handle(self, h: _Handler) -> None:
        raw_path, _, raw_query = h.path.partition("?")
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        query = dict(parse_qsl(raw_query, keep_blank_values=True))
        route, args = self._match(h.command, raw_path)
        action = route.action if route else "Unknown"
        product = route.product if route else "PAI"
        request_id = str(uuid.uuid4()).upper()
        faults = self.faults
        fault, after = faults.draw() if faults else (None, False)
        status = 0
        try:
            if fault and not after:
                if fault != "drop":
                    status = self._send_fault(h, fault, product, request_id)
                return
            try:
                self._authenticate(h.command, raw_path, raw_query, h.headers, body)
                if route is None:
                    raise ApiError(404, "InvalidApi.NotFound", "Specified api is not found.")
                payload = route.handler(query, body, **args)
                payload["RequestId"] = request_id
                code = 200
            except ApiError as exc:
                code, payload = exc.status, self._error(product, request_id, exc.code, exc.message)
            except Exception as exc:  # an emulator bug: answer like the service, keep the trace
                traceback.print_exc()
                code, payload = 500, self._error(product, request_id, "InternalError", repr(exc))
            if fault != "drop":
                status = _send_json(h, code, payload, request_id)
        finally:
            if status == 0:
                h.close_connection = True
            self.log.add(
                RequestRecord(
                    time=time.time(),
                    service="pai",
                    method=h.command,
                    path=unquote(raw_path),
                    query=query,
                    action=action,
                    status=status,
                    fault=fault,
                    bytes_in=len(body),
                )
            )

    def _match(self, method: str, raw_path: str) -> tuple[_Route | None, dict[str, str]]:
        for route in self._routes:
            found = route.pattern.fullmatch(raw_path)
            if found and route.method == method:
                return route, {k: unquote(v) for k, v in found.groupdict().items()}
        return None, {}

    def _send_fault(self, h: _Handler, fault: Fault, product: str, request_id: str) -> int:
        if fault == "throttle":  # help.aliyun.com/knowledge_detail/446611.html: HttpCode=400
            code, error, message = (
                400,
                "Throttling.User",
                "Request was denied due to user flow control.",
            )
        else:
            with self._lock:
                self._errors += 1
                odd = self._errors % 2
            code, error, message = (
                (500, "InternalError", "The request processing has failed due to unknown error.")
                if odd
                else (503, "ServiceUnavailable", "The service is temporarily unavailable.")
            )
        return _send_json(h, code, self._error(product, request_id, error, message), request_id)

    def _error(self, product: str, request_id: str, code: str, message: str) -> dict[str, Any]:
        return {
            "RequestId": request_id,
            "HostId": f"{product.lower()}.{self.region}.aliyuncs.com",
            "Code": code,
            "Message": message,
            "Recommend": f"https://api.aliyun.com/troubleshoot?q={code}&product={product}"
            f"&requestId={request_id}",
        }

    # authentication --------------------------------------------------------------------
    def _authenticate(
        self, method: str, raw_path: str, raw_query: str, headers: Message, body: bytes
    ) -> None:
        """Recompute the request's signature, ACS3-HMAC-SHA256 or ROA; raise on a mismatch."""
        scheme, _, rest = (headers.get("Authorization") or "").partition(" ")
        if scheme == ALGORITHM:
            self._check_acs3(rest, method, raw_path, raw_query, headers, body)
        elif scheme == ROA_SCHEME:
            self._check_roa(rest, method, raw_path, raw_query, headers)
        else:
            raise ApiError(
                400,
                "IncompleteSignature",
                f"The request signature does not conform to Aliyun standards: expected "
                f"'{ALGORITHM} Credential=...,SignedHeaders=...,Signature=...' or "
                f"'{ROA_SCHEME} <AccessKeyId>:<Signature>'.",
            )
        nonce = headers.get("x-acs-signature-nonce")
        if nonce:
            with self._lock:
                self._nonces[nonce] = time.time()

    def _check_acs3(
        self,
        rest: str,
        method: str,
        raw_path: str,
        raw_query: str,
        headers: Message,
        body: bytes,
    ) -> None:
        """``ACS3-HMAC-SHA256 Credential=...,SignedHeaders=...,Signature=<hex>``."""
        fields = dict(p.strip().split("=", 1) for p in rest.split(",") if "=" in p)
        if not {"Credential", "SignedHeaders", "Signature"} <= set(fields):
            raise ApiError(
                400,
                "IncompleteSignature",
                f"The request signature does not conform to Aliyun standards: expected "
                f"'{ALGORITHM} Credential=...,SignedHeaders=...,Signature=...'.",
            )
        self._check_access_key(fields["Credential"], headers)
        signed = fields["SignedHeaders"].split(";")
        for required in ("host", "x-acs-date", "x-acs-signature-nonce", "x-acs-content-sha256"):
            if required not in signed:
                raise ApiError(400, "IncompleteSignature", f"Header {required} must be signed.")
        try:
            sent = datetime.strptime(headers.get("x-acs-date") or "", "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            raise _bad_time() from None
        self._check_fresh(sent.replace(tzinfo=UTC).timestamp(), headers)
        canonical_headers = "".join(
            f"{name}:{','.join(sorted(v.strip() for v in headers.get_all(name) or []))}\n"
            for name in signed
        )
        canonical_query = "&".join(
            f"{k}={quote(v, safe='~')}"
            for k, v in sorted(parse_qsl(raw_query, keep_blank_values=True))
        )
        canonical = "\n".join(
            [
                method,
                raw_path or "/",
                canonical_query,
                canonical_headers,
                fields["SignedHeaders"],
                hashlib.sha256(body).hexdigest(),
            ]
        )
        string_to_sign = f"{ALGORITHM}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        expected = hmac.new(
            self.credentials.access_key_secret.encode(), string_to_sign.encode(), hashlib.sha256
        ).hexdigest()
        _compare(expected, fields["Signature"], string_to_sign)

    def _check_roa(
        self, rest: str, method: str, raw_path: str, raw_query: str, headers: Message
    ) -> None:
        """``acs <AccessKeyId>:<base64 HMAC-SHA1>``, the older ROA signature.

        StringToSign: method, accept, content-md5, content-type and date (each followed by a
        newline), every ``x-acs-*`` header sorted as ``name:value\\n``, then the path and, when
        there is a query, ``?`` and its decoded parameters sorted as ``k=v`` (a blank value as
        ``k``) joined by ``&``.  The body is not signed.
        """
        key_id, colon, signature = rest.strip().rpartition(":")
        if not colon or not key_id or not signature:
            raise ApiError(
                400,
                "IncompleteSignature",
                f"The request signature does not conform to Aliyun standards: expected "
                f"'{ROA_SCHEME} <AccessKeyId>:<Signature>'.",
            )
        self._check_access_key(key_id, headers)
        signature_method = headers.get("x-acs-signature-method")
        if signature_method not in (None, ROA_METHOD):
            raise ApiError(
                400,
                "IncompleteSignature",
                f"Specified signature method {signature_method} is not supported "
                f"(expected {ROA_METHOD}).",
            )
        date = headers.get("date")
        if not date:
            raise ApiError(400, "MissingDate", "Date is mandatory for this action.")
        try:
            sent = email.utils.parsedate_to_datetime(date)
        except (TypeError, ValueError):
            raise _bad_time() from None
        if sent.tzinfo is None:  # "-0000": UTC by RFC 2822
            sent = sent.replace(tzinfo=UTC)
        self._check_fresh(sent.timestamp(), headers)
        acs_headers = sorted(
            (name.lower(), value)
            for name, value in headers.items()
            if name.lower().startswith("x-acs-")
        )
        query = sorted(parse_qsl(raw_query, keep_blank_values=True))
        resource = raw_path or "/"
        if query:
            resource += "?" + "&".join(f"{k}={v}" if v else k for k, v in query)
        string_to_sign = "".join(
            [
                *(
                    f"{value}\n"
                    for value in (
                        method,
                        headers.get("accept") or "",
                        headers.get("content-md5") or "",
                        headers.get("content-type") or "",
                        date,
                    )
                ),
                *(f"{name}:{value}\n" for name, value in acs_headers),
                resource,
            ]
        )
        digest = hmac.new(
            self.credentials.access_key_secret.encode(), string_to_sign.encode(), hashlib.sha1
        ).digest()
        _compare(base64.b64encode(digest).decode(), signature, string_to_sign)

    def _check_access_key(self, key_id: str, headers: Message) -> None:
        creds = self.credentials
        if key_id != creds.access_key_id:
            raise ApiError(400, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        token = headers.get("x-acs-security-token")
        if token != creds.security_token or (
            token and headers.get("x-acs-accesskey-id") != creds.access_key_id
        ):
            raise ApiError(
                400,
                "InvalidSecurityToken.MismatchWithAccessKey",
                "Specified SecurityToken mismatch with the AccessKey.",
            )

    def _check_fresh(self, sent: float, headers: Message) -> None:
        """The request time is within the allowed clock skew; its nonce was not used before."""
        current = time.time()
        if abs(sent - current) > CLOCK_SKEW_SECONDS:
            raise ApiError(
                400, "InvalidTimeStamp.Expired", "Specified time stamp or date value is expired."
            )
        with self._lock:
            for nonce, seen in list(self._nonces.items()):
                if current - seen > CLOCK_SKEW_SECONDS:
                    del self._nonces[nonce]
            if headers.get("x-acs-signature-nonce") in self._nonces:
                raise ApiError(
                    400, "SignatureNonceUsed", "Specified signature nonce was used already."
                )

    # TrainingJob API -------------------------------------------------------------------
    def _create_job(self, query: dict[str, str], body: bytes) -> dict[str, Any]:
        request = _json_object(body)
        regexes = self._validate(request)
        with self._lock:
            job_id = "train" + _random_id(14)
            created = time.time()
            job = _Job(
                id=job_id,
                request=request,
                created=created,
                seq=len(self._jobs),
                dir=self.job_dir(job_id),
                metric_regexes=regexes,
            )
            job.dir.mkdir(parents=True, exist_ok=True)
            self._jobs[job_id] = job
            self._transition(job, "Creating")
            job.thread = threading.Thread(target=self._run, args=(job,), name=job_id, daemon=True)
            job.thread.start()
        return {"TrainingJobId": job_id}

    def _validate(self, request: dict[str, Any]) -> list[tuple[str, re.Pattern[str]]]:
        """Reject what the service rejects at CreateTrainingJob; return the metric regexes."""
        for name in ("TrainingJobName", "WorkspaceId"):
            if not isinstance(request.get(name), str) or not request[name]:
                raise ApiError(400, f"Missing{name}", f"{name} is mandatory for this action.")
        spec = request.get("AlgorithmSpec")
        if not isinstance(spec, dict):
            raise _invalid(
                "AlgorithmSpec",
                "an AlgorithmSpec is required (the emulator has no algorithm registry)",
            )
        if not isinstance(spec.get("Image"), str) or not spec["Image"]:
            raise _invalid("AlgorithmSpec.Image", "the training image is required")
        command = spec.get("Command")
        if not isinstance(command, list) or not command or not _all_str(command):
            raise _invalid("AlgorithmSpec.Command", "a non-empty list of strings is required")
        for location in (spec.get("CodeDir"), request.get("CodeDir")):
            if location is not None:
                _location_uri(location)
        resource = request.get("ComputeResource")
        if not isinstance(resource, dict):
            raise _invalid("ComputeResource", "ComputeResource is required")
        ecs_spec = resource.get("EcsSpec")
        if not isinstance(ecs_spec, str) or not ecs_spec:
            raise _invalid("ComputeResource.EcsSpec", "EcsSpec is required")
        if ecs_spec not in self.instance_types:
            raise _invalid(
                "ComputeResource.EcsSpec",
                f"{ecs_spec} is not an available instance type in {self.region}",
            )
        count = resource.get("EcsCount", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise _invalid("ComputeResource.EcsCount", f"{count!r} is not a positive integer")
        _pairs(request, "HyperParameters", "Name", "Value")
        _pairs(request, "Labels", "Key", "Value")
        for name, uri_key in (("InputChannels", "InputUri"), ("OutputChannels", "OutputUri")):
            for channel in _list_of_dicts(request, name):
                if not isinstance(channel.get("Name"), str) or not channel["Name"]:
                    raise _invalid(f"{name}.Name", "every channel needs a Name")
                uri = channel.get(uri_key)
                if not isinstance(uri, str) or not uri.startswith("oss://"):
                    raise _invalid(f"{name}.{uri_key}", f"{uri!r} is not an oss:// URI")
        environments = request.get("Environments", {})
        if not isinstance(environments, dict) or not _all_str(
            [*environments, *environments.values()]
        ):
            raise _invalid("Environments", "a map of strings to strings is required")
        requirements = request.get("PythonRequirements", [])
        if not isinstance(requirements, list) or not _all_str(requirements):
            raise _invalid("PythonRequirements", "a list of strings is required")
        scheduler = request.get("Scheduler") or {}
        if not isinstance(scheduler, dict):
            raise _invalid("Scheduler", "an object is required")
        for key in ("MaxRunningTimeInSeconds", "MaxRunningTimeInMinutes"):
            limit = scheduler.get(key)
            if limit is not None and (not isinstance(limit, int) or limit <= 0):
                raise _invalid(f"Scheduler.{key}", f"{limit!r} is not a positive integer")
        regexes = []
        for definition in spec.get("MetricDefinitions") or []:
            try:
                regexes.append((definition["Name"], re.compile(definition["Regex"])))
            except (KeyError, TypeError, re.error) as exc:
                raise _invalid(
                    "AlgorithmSpec.MetricDefinitions", f"{definition!r}: {exc}"
                ) from None
        return regexes

    def _get_job(self, query: dict[str, str], body: bytes, job: str) -> dict[str, Any]:
        with self._lock:
            return self._view(self._find(job))

    def _list_jobs(self, query: dict[str, str], body: bytes) -> dict[str, Any]:
        labels = _json_labels(query.get("Labels"))
        name = query.get("TrainingJobName", "").lower()
        statuses = {s for s in query.get("Status", "").split(",") if s}
        start = _parse_time(query, "StartTime")
        end = _parse_time(query, "EndTime")
        sort_key = query.get("SortBy") or "GmtCreateTime"
        if sort_key not in ("GmtCreateTime", "GmtModifiedTime", "TrainingJobName", "Status"):
            raise _invalid("SortBy", f"{sort_key} is not a sortable field")

        def wanted(job: _Job) -> bool:
            request = job.request
            return (
                (query.get("WorkspaceId") or request["WorkspaceId"]) == request["WorkspaceId"]
                and (query.get("TrainingJobId") or job.id) == job.id
                and name in request["TrainingJobName"].lower()
                and (not statuses or job.status in statuses)
                and (start is None or job.created >= start)
                and (end is None or job.created <= end)
                and _has_labels(job, labels)
            )

        with self._lock:
            jobs = [job for job in self._jobs.values() if wanted(job)]
            keys: dict[str, Callable[[_Job], Any]] = {
                "GmtCreateTime": lambda j: (j.created, j.seq),
                "GmtModifiedTime": lambda j: (j.modified, j.seq),
                "TrainingJobName": lambda j: (j.request["TrainingJobName"], j.seq),
                "Status": lambda j: (j.status, j.seq),
            }
            jobs.sort(key=keys[sort_key], reverse=_descending(query, default="DESC"))
            page = _page(jobs, query)
            items = [_list_item(self._view(job), job.dlc_id) for job in page]
        return {"TrainingJobs": items, "TotalCount": len(jobs)}

    def _stop_job(self, query: dict[str, str], body: bytes, job: str) -> dict[str, Any]:
        with self._lock:
            found = self._find(job)
        self._interrupt(found, "user")
        return {}

    def _update_labels(self, query: dict[str, str], body: bytes, job: str) -> dict[str, Any]:
        """Add or overwrite labels (Labels: [{Key, Value}]); the others stay."""
        request = _json_object(body)
        _pairs(request, "Labels", "Key", "Value")
        with self._lock:
            found = self._find(job)
            labels = {label["Key"]: label["Value"] for label in found.request.get("Labels") or []}
            labels.update({label["Key"]: label["Value"] for label in request.get("Labels") or []})
            found.request["Labels"] = [{"Key": k, "Value": v} for k, v in labels.items()]
        return {}

    def _list_logs(self, query: dict[str, str], body: bytes, job: str) -> dict[str, Any]:
        start = _parse_time(query, "StartTime")
        end = _parse_time(query, "EndTime")
        with self._lock:
            found = self._find(job)
            if found.run_start is None:  # the pai SDK catches exactly this code while polling
                raise ApiError(
                    404,
                    "TRAINING_JOB_INSTANCE_NOT_FOUND",
                    f"No instance of training job {found.id} has been started yet.",
                )
            lines = [
                text
                for at, text in found.logs
                if (start is None or at >= start) and (end is None or at <= end)
            ]
            worker = query.get("WorkerId")
            if worker and found.instances:  # one instance's own log (no job: the master's)
                named = [i for i in found.instances if i.name == worker]
                if not named:
                    raise ApiError(404, "WORKER_NOT_FOUND", f"No instance {worker} in {job}.")
                lines = list(named[0].logs)
        return {"Logs": _page(lines, query), "TotalCount": str(len(lines))}

    def _list_metrics(self, query: dict[str, str], body: bytes, job: str) -> dict[str, Any]:
        start = _parse_time(query, "StartTime")
        end = _parse_time(query, "EndTime")
        with self._lock:
            metrics = [
                m
                for m in self._find(job).metrics
                if (not query.get("Name") or m[0] == query["Name"])
                and (start is None or m[2] >= start)
                and (end is None or m[2] <= end)
            ]
        if _descending(query, default="ASC"):
            metrics.reverse()
        return {"Metrics": [_metric(m) for m in _page(metrics, query)], "TotalCount": len(metrics)}

    def _latest(self, query: dict[str, str], body: bytes, job: str) -> dict[str, Any]:
        names = {n for n in query.get("Names", "").split(",") if n}
        with self._lock:
            latest = _latest_metrics(self._find(job))
        return {"Metrics": [m for m in latest if not names or m["Name"] in names]}

    def _find(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise ApiError(404, "TRAINING_JOB_NOT_FOUND", f"Training job {job_id} does not exist.")
        return job

    def _view(self, job: _Job) -> dict[str, Any]:
        """The GetTrainingJob body (without RequestId)."""
        request = job.request
        view: dict[str, Any] = {k: request[k] for k in ECHOED if request.get(k) is not None}
        resource = request["ComputeResource"]
        outputs = {c["Name"]: c["OutputUri"] for c in request.get("OutputChannels") or []}
        finished = job.end or time.time()
        view |= {
            "TrainingJobId": job.id,
            "TrainingJobName": request["TrainingJobName"],
            "WorkspaceId": request["WorkspaceId"],
            "UserId": ACCOUNT_UID,
            "IsTempAlgo": True,
            "Status": job.status,
            "StatusTransitions": [dict(t) for t in job.transitions],
            "ComputeResource": {"EcsCount": 1, **resource},
            "GmtCreateTime": _iso(job.created),
            "GmtModifiedTime": _iso(job.modified),
            "Duration": int(finished - job.run_start) if job.run_start else 0,
            "TrainingJobUrl": f"https://pai.console.aliyun.com/?regionId={self.region}"
            f"&workspaceId={request['WorkspaceId']}#/training/jobs/{job.id}",
            "LatestMetrics": _latest_metrics(job),
        }
        if job.reason_code:
            view |= {"ReasonCode": job.reason_code, "ReasonMessage": job.reason_message}
        if job.instances:
            view["Instances"] = [
                {"Name": i.name, "Role": i.role, "Status": i.status} for i in job.instances
            ]
        elif job.run_start:
            state = job.status if job.status in TERMINAL else "Running"
            view["Instances"] = [
                {"Name": f"{job.dlc_id}-worker-0", "Role": "Worker", "Status": state}
            ]
        if "model" in outputs:
            view["OutputModel"] = {"OutputChannelName": "model", "Uri": outputs["model"]}
        return view

    # AIWorkspace ListImages ------------------------------------------------------------
    def _list_images(self, query: dict[str, str], body: bytes) -> dict[str, Any]:
        conditions = [
            (key.strip(), sep, value.strip())
            for key, sep, value in (c.partition("=") for c in query.get("Labels", "").split(","))
            if key.strip()
        ]
        name = query.get("Name", "")
        exact = "ExactMatchName" in query.get("Options", "")
        text = query.get("Query", "").lower()
        images = []
        for image in self.images:
            labels = {label["Key"]: label["Value"] for label in image["Labels"]}
            if any(
                labels.get(key) != value if sep else key not in labels
                for key, sep, value in conditions
            ):
                continue
            if name and (
                image["Name"] != name if exact else name.lower() not in image["Name"].lower()
            ):
                continue
            if text and text not in (image["Name"] + " " + image["Description"]).lower():
                continue
            if query.get("ImageUri") and image["ImageUri"] != query["ImageUri"]:
                continue
            images.append(image)
        images.sort(key=lambda i: i["GmtCreateTime"], reverse=_descending(query, default="ASC"))
        verbose = query.get("Verbose", "").lower() == "true"
        page = [i if verbose else {k: v for k, v in i.items() if k != "Labels"} for i in images]
        return {"Images": _page(page, query), "TotalCount": len(images)}

    def _image_available(self, uri: str) -> bool:
        repo = re.fullmatch(
            rf"(?:dsw-registry(?:-vpc)?\.{re.escape(self.region)}\.cr\.aliyuncs\.com/pai"
            rf"|registry(?:-vpc)?\.{re.escape(self.region)}\.aliyuncs\.com/pai-dlc)/(.+)",
            uri,
        )
        if repo and repo.group(1) in {name for name, *_ in OFFICIAL_IMAGES}:
            return True
        return bool(self.image_allow and self.image_allow.fullmatch(uri))

    # job execution ---------------------------------------------------------------------
    def _run(self, job: _Job) -> None:
        """The job's life after CreateTrainingJob, one phase every ``phase_seconds``."""
        try:
            for status in ("Created", "Initializing"):
                if self._pause(job):
                    return
                self._transition(job, status)
            failure = self._prepare(job)
            if failure:
                self._finish(job, "InitializeFailed", *failure)
                return
            while not self.admit.is_set():  # held before it runs
                if self._pause(job):
                    return
            for status in ("Submitted", "Running"):
                if self._pause(job):
                    return
                if status == "Running" and not self._image_available(self._image(job)):
                    self._finish(
                        job,
                        "Failed",
                        "ImagePullBackOff",
                        f'Back-off pulling image "{self._image(job)}": the image does not exist '
                        "or cannot be pulled.",
                    )
                    return
                if status == "Running" and self.engine and not self._local_image(job):
                    self._finish(
                        job,
                        "Failed",
                        "ImagePullBackOff",
                        f'Back-off pulling image "{self._image(job)}": no local image stands '
                        "in for it (the emulator's local_images).",
                    )
                    return
                self._transition(job, status)
            self._finish(job, *self._execute(job))
        except Exception as exc:  # an emulator bug: fail the job visibly
            traceback.print_exc()
            self._finish(job, "Failed", "InternalError", f"emulator error: {exc!r}")

    def _pause(self, job: _Job) -> bool:
        """Wait one phase; on a stop, end the job (Terminated) and return True."""
        if job.stop_event.wait(self.phase_seconds):
            self._finish(job, *self._stopped(job))
            return True
        return False

    def _image(self, job: _Job) -> str:
        return str(job.request["AlgorithmSpec"]["Image"])

    def _local_image(self, job: _Job) -> str | None:
        return self.engine.image_for(self._image(job)) if self.engine else None

    def _prepare(self, job: _Job) -> tuple[str, str] | None:
        """Fetch code and inputs, lay out ``ml/``; return (ReasonCode, ReasonMessage) on failure."""
        request = job.request
        spec = request["AlgorithmSpec"]
        usercode = job.ml / "usercode"
        for sub in ("usercode", "input/config", "input/data", "output"):
            (job.ml / sub).mkdir(parents=True, exist_ok=True)
        (job.ml / "code").symlink_to("usercode")  # the older name of the same directory
        location = spec.get("CodeDir") or request.get("CodeDir")
        if location:
            failure = self._fetch_code(_location_uri(location), usercode)
            if failure:
                return failure
        for channel in request.get("InputChannels") or []:
            uri = channel["InputUri"]
            if self._object_kind(uri) is None:
                return _missing(f"input channel {channel['Name']}", uri, self.store)
            self.store.download_uri(uri, job.ml / "input" / "data" / channel["Name"])
        for channel in request.get("OutputChannels") or []:
            bucket, _ = split_uri(channel["OutputUri"])
            if not self.store.bucket_exists(bucket):
                return (
                    "NoSuchBucket",
                    f"output channel {channel['Name']}: bucket {bucket} does not exist.",
                )
            output = job.ml / "output" / channel["Name"]
            if self._object_kind(channel["OutputUri"]) == "prefix":  # mounted: what is there
                self.store.download_uri(channel["OutputUri"], output)
            output.mkdir(parents=True, exist_ok=True)
        hps = {hp["Name"]: hp["Value"] for hp in request.get("HyperParameters") or []}
        (job.ml / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hps, indent=2))
        return None

    def _object_kind(self, uri: str) -> str | None:
        """ "object", "prefix" (at least one key below it) or None when nothing is there."""
        bucket, key = split_uri(uri)
        if not self.store.bucket_exists(bucket):
            return None
        if key and not key.endswith("/") and self.store.head(bucket, key) is not None:
            return "object"
        prefix = key if not key or key.endswith("/") else key + "/"
        return "prefix" if next(iter(self.store.keys(bucket, prefix)), None) else None

    def _fetch_code(self, uri: str, usercode: Path) -> tuple[str, str] | None:
        """Copy the CodeDir into ``usercode``; (ReasonCode, ReasonMessage) if it cannot be had.

        A key ending in ``/`` is a prefix whose files are the code: what the PAI SDK (0.4.13)
        uploads for ``source_dir``. Any other key names one object. A ``.tar.gz`` (``.tgz``,
        ``.tar``) is unpacked: earlier SDK releases uploaded ``source_dir`` as
        ``training_src/<job>/source.tar.gz`` and sent that key (``_build_code_input``:
        ``upload(..., is_tar=True)``, "PAI download the source code passing by CodeDir and
        untar to directory /ml/usercode/"), and 0.4.13 still fetches OSS code of model recipes
        with ``un_tar=True``. Another file is copied as it is (0.4.13 uploads a ``source_dir``
        that is one file to ``training_src/<job>/<name>`` and sends that key).
        """
        bucket, key = split_uri(uri)
        if not key or key.endswith("/"):
            if self._object_kind(uri) != "prefix":
                return _missing("CodeDir", uri, self.store)
            self.store.download_uri(uri, usercode)
            return None
        if self.store.head(bucket, key) is None:
            code, message = _missing("CodeDir", uri, self.store)
            if self._object_kind(uri) == "prefix":
                message += f" A prefix of files is named with a trailing /: {uri}/"
            return code, message
        if not key.endswith((".tar.gz", ".tgz", ".tar")):
            self.store.download_uri(uri, usercode)
            return None
        try:
            with tarfile.open(fileobj=io.BytesIO(self.store.get(bucket, key) or b"")) as archive:
                archive.extractall(usercode, filter="data")
        except (tarfile.TarError, OSError) as exc:
            return "InvalidCodeDir", f"CodeDir {uri} is not a readable tar archive: {exc}"
        return None

    def _environment(self, job: _Job, layout: contract.JobLayout) -> dict[str, str]:
        """The job's Environments and every ``PAI_*`` variable of the contract for ``layout``.

        On PAI a job has its instances to itself; here the jobs in flight share this machine,
        so each one's OpenMP/BLAS threads are its share of the CPUs (a job's Environments may
        say otherwise): N jobs each spinning a thread per core would slow one another down
        several times over.
        """
        with self._lock:
            jobs = sum(other.status not in TERMINAL for other in self._jobs.values())
        threads = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
        request = job.request
        hps = {hp["Name"]: hp["Value"] for hp in request.get("HyperParameters") or []}
        inputs = {
            channel["Name"]: (
                channel["InputUri"].rsplit("/", 1)[-1]
                if self._object_kind(channel["InputUri"]) == "object"
                else None
            )
            for channel in request.get("InputChannels") or []
        }
        outputs = [channel["Name"] for channel in request.get("OutputChannels") or []]
        env = dict.fromkeys(THREAD_VARIABLES, threads) | (request.get("Environments") or {})
        return env | contract.environment(layout, hps, inputs, outputs)

    def _execute(self, job: _Job) -> tuple[str, str | None, str | None]:
        """Install the requirements, run the command; the final (status, code, message)."""
        limit = _time_limit(job.request)
        timer = threading.Timer(limit, self._interrupt, (job, "timeout")) if limit else None
        if timer:
            timer.daemon = True
            timer.start()
        done = threading.Event()
        mount = threading.Thread(target=self._write_through, args=(job, done), daemon=True)
        mount.start()
        try:
            if self.engine and _instance_count(job.request) > 1:
                return self._execute_instances(job, self.engine)
            if self.engine:
                return self._execute_in_container(job, self.engine)
            return self._execute_on_host(job)
        finally:
            done.set()
            mount.join()
            if timer:
                timer.cancel()

    def _write_through(self, job: _Job, done: threading.Event) -> None:
        """The output channels' mounts: every file that changed since the last pass is put
        to its channel's ``OutputUri``, until the command has ended (``_finish`` puts all)."""
        seen: dict[Path, tuple[int, int]] = {}
        while not done.wait(MOUNT_SYNC_SECONDS):
            for channel in job.request.get("OutputChannels") or []:
                source = job.ml / "output" / channel["Name"]
                bucket, prefix = split_uri(channel["OutputUri"])
                prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
                for path in sorted(p for p in source.rglob("*") if p.is_file()):
                    try:
                        stat = path.stat()
                        if seen.get(path) != (stat.st_size, stat.st_mtime_ns):
                            key = prefix + path.relative_to(source).as_posix()
                            self.store.put(bucket, key, path.read_bytes())
                            seen[path] = (stat.st_size, stat.st_mtime_ns)
                    except FileNotFoundError:
                        continue  # removed by the command meanwhile

    @staticmethod
    def _write_entry(job: _Job) -> Path:
        """The job's ``runtime`` directory, holding the entry script its containers run: it
        installs the requirements, then runs the command."""
        request = job.request
        runtime = job.dir / "runtime"
        runtime.mkdir(exist_ok=True)
        (runtime / "entry.sh").write_text(
            entry_script(
                list(request.get("PythonRequirements") or []),
                (job.ml / "usercode" / "requirements.txt").is_file(),
                request["AlgorithmSpec"]["Command"],
            )
        )
        return runtime

    def _execute_in_container(
        self, job: _Job, engine: ContainerEngine
    ) -> tuple[str, str | None, str | None]:
        """One container: its entry script installs the requirements, then runs the command."""
        runtime = self._write_entry(job)
        env = self._environment(job, contract.JobLayout())
        image = self._local_image(job)
        assert image is not None  # checked before the job ran
        code = self._spawn(job, lambda: engine.start(job.id, image, job.ml, runtime, env))
        if job.stop_reason or code is None:
            return self._stopped(job)
        failed = runtime / "requirements-failed"
        if failed.exists():
            code_text = failed.read_text().strip()
            message = f"Installing Python requirements failed with exit code {code_text}."
            return "Failed", "RequirementsInstallFailed", message
        return _outcome(code)

    def _execute_instances(
        self, job: _Job, engine: ContainerEngine
    ) -> tuple[str, str | None, str | None]:
        """A multi-instance job as DLC runs it: one container per instance on a network of
        the job's, each its own copy of ``ml/`` (the output channels shared) and DLC's
        distributed variables. The first instance to fail fails the job, naming it, and the
        others are stopped."""
        request = job.request
        job_type = request["AlgorithmSpec"].get("JobType") or "PyTorchJob"
        names = _instance_names(job_type, _instance_count(request))
        with self._lock:
            job.instances = [
                _Instance(
                    f"{job.dlc_id}-{name}", "Master" if name.startswith("master") else "Worker"
                )
                for name in names
            ]
        runtime = self._write_entry(job)
        image = self._local_image(job)
        assert image is not None  # checked before the job ran
        hosts = [instance.name for instance in job.instances]
        network = engine.create_network(job.id)
        group = InstanceGroup()
        with self._lock:
            job.running = group
        shared = str(job.ml)  # an instance's copy of it leaves out the outputs: they are mounted
        exits: queue.Queue[tuple[int, int]] = queue.Queue()
        first: tuple[_Instance, int] | None = None
        try:
            for rank, instance in enumerate(job.instances):
                ml = job.ml if rank == 0 else job.dir / "instances" / names[rank] / "ml"
                if rank:
                    shutil.copytree(
                        job.ml, ml, symlinks=True, ignore=lambda d, _: ["output"] * (d == shared)
                    )
                env = self._environment(job, contract.JobLayout())
                env |= _distributed(job_type, rank, hosts)
                where = Instance(instance.name, network, job.ml / "output")
                if job.stop_reason:
                    break
                container = engine.start(job.id, image, ml, runtime, env, where)
                group.add(container)
                threading.Thread(
                    target=self._follow, args=(job, rank, container, exits), daemon=True
                ).start()
            if job.stop_reason:
                group.kill()
            for _ in range(len(group.members)):
                rank, code = exits.get()
                instance = job.instances[rank]
                with self._lock:
                    if code == 0:
                        instance.status = "Succeed"
                    elif first is None and not job.stop_reason:
                        instance.status, first = "Failed", (instance, code)
                    else:
                        instance.status = "Terminated"
                if first is not None:
                    group.kill()
        finally:
            with self._lock:
                job.running = None
                for instance in job.instances:
                    if instance.status == "Running":
                        instance.status = "Terminated"
            group.close()
            engine.remove_network(network)
        if job.stop_reason:
            return self._stopped(job)
        if first is not None:
            instance, code = first
            _, reason, message = _outcome(code)
            return "Failed", reason, f"Instance {instance.name} ({instance.role}): {message}"
        return "Succeed", None, None

    def _follow(self, job: _Job, rank: int, container: Running, exits: queue.Queue) -> None:
        """Log an instance's output (the master's is the job's log), then report its exit."""
        instance = job.instances[rank]
        for line in container.lines():
            if rank == 0:
                self._append_log(job, line)
            with self._lock:
                instance.logs.append(line)
        exits.put((rank, container.wait()))

    def _execute_on_host(self, job: _Job) -> tuple[str, str | None, str | None]:
        """Install what the host interpreter lacks, then run the command in ``ml/usercode``."""
        request = job.request
        env = {k: v for k, v in os.environ.items() if HOST_ENV.fullmatch(k)}
        env |= self._environment(job, contract.JobLayout(job.ml))
        # A host process has no /ml of its own: a variable naming a place under /ml (the job's
        # MLflow store, say) names that place in its ml directory, as in its container.
        mlroot.rebase_paths(env, str(contract.ML_ROOT), str(job.ml))
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        usercode = job.ml / "usercode"
        requirements = list(request.get("PythonRequirements") or [])
        requirements_file = usercode / "requirements.txt"
        if requirements_file.is_file():
            requirements += requirements_file.read_text().splitlines()
        missing = _unsatisfied(requirements)
        if missing:
            self._append_log(job, "Installing Python requirements: " + ", ".join(missing))
            pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
            code = self._spawn(job, lambda: self._host_process([*pip, *missing], env, usercode))
            if job.stop_reason:
                return self._stopped(job)
            if code != 0:
                message = f"Installing Python requirements failed with exit code {code}."
                return "Failed", "RequirementsInstallFailed", message
        command = ["sh", "-c", shlex.join(request["AlgorithmSpec"]["Command"])]
        code = self._spawn(job, lambda: self._host_process(command, env, usercode))
        if job.stop_reason or code is None:
            return self._stopped(job)
        return _outcome(code)

    def _host_process(self, argv: list[str], env: dict[str, str], cwd: Path) -> HostProcess:
        return HostProcess(argv, env, cwd, KILL_GRACE_SECONDS)

    def _spawn(self, job: _Job, start: Callable[[], Running]) -> int | None:
        """Start a command, every output line into the job log; its exit code, or None when
        the job was stopped before it started."""
        if job.stop_reason:
            return None
        running = start()
        with self._lock:
            job.running = running
            stopped = job.stop_reason is not None
        try:
            if stopped:  # stopped while it was starting: _interrupt found nothing to kill
                running.kill()
            for line in running.lines():
                self._append_log(job, line)
            return running.wait()
        finally:
            with self._lock:
                job.running = None
            running.close()

    def _stopped(self, job: _Job) -> tuple[str, str, str]:
        if job.stop_reason == "timeout":
            limit = _time_limit(job.request)
            message = f"The job ran longer than MaxRunningTimeInSeconds={limit} and was stopped."
            return "Failed", "JobTimeout", message
        if job.stop_reason == "reclaim":
            return "Failed", RECLAIM_CODE, RECLAIM_MESSAGE
        return "Terminated", "JobStoppedByUser", "The training job was stopped."

    def _interrupt(self, job: _Job, reason: str) -> None:
        """Stop a job: mark why, wake its thread, stop its command (TERM, then KILL).

        A user's stop shows as ``Stopping`` until the job thread sets the final status.
        """
        with self._lock:
            if job.status in TERMINAL or job.stop_reason:
                return
            job.stop_reason = reason
            if reason == "user":
                job.stopping_since = time.time()
                self._transition(job, "Stopping")
            job.stop_event.set()
            running = job.running
        if running is not None:
            threading.Thread(target=running.kill, daemon=True).start()

    def _append_log(self, job: _Job, line: str) -> None:
        at = time.time()
        found = [
            (name, float(match.group(1)), at)
            for name, regex in job.metric_regexes
            if (match := regex.search(line)) and regex.groups and _is_float(match.group(1))
        ]
        with self._lock:
            job.logs.append((at, line))
            job.metrics.extend(found)
            with (job.dir / "job.log").open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    def _transition(
        self, job: _Job, status: str, code: str | None = None, message: str | None = None
    ) -> None:
        """Record the job's next status; once it is Stopping, only its final one (the job's
        thread may pass its last pause just as the stop comes)."""
        with self._lock:
            if job.status == "Stopping" and status not in TERMINAL:
                return
            at = time.time()
            stamp = _iso(at)
            if job.transitions:
                job.transitions[-1]["EndTime"] = stamp
            entry = {"Status": status, "StartTime": stamp}
            if code:
                entry |= {"ReasonCode": code, "ReasonMessage": message or ""}
            if status in TERMINAL:
                entry["EndTime"] = stamp
                job.end = at
                job.reason_code, job.reason_message = code, message
            job.transitions.append(entry)
            job.status, job.modified = status, at
            if status == "Running":
                job.run_start = at
            (job.dir / "job.json").write_text(json.dumps(self._view(job), indent=2))

    def _finish(self, job: _Job, status: str, code: str | None, message: str | None) -> None:
        """Push the outputs of a job that ran, then set its final status (once).

        A job a user stopped stays ``Stopping`` for at least one phase, as on PAI.
        """
        if job.status in TERMINAL:
            return
        if job.stopping_since is not None:
            time.sleep(max(0.0, job.stopping_since + self.phase_seconds - time.time()))
        if job.run_start is not None:
            for channel in job.request.get("OutputChannels") or []:
                source = job.ml / "output" / channel["Name"]
                if source.is_dir():
                    self.store.upload_tree(source, channel["OutputUri"])
        self._transition(job, status, code, message)


class _HttpServer(ServiceHttpServer):
    def __init__(self, address: tuple[str, int], pai: PaiServer) -> None:
        self.pai = pai
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def do_GET(self) -> None:
        self.server.pai._handle(self)

    do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        """Requests go to the RequestLog, not stderr."""


# helpers ---------------------------------------------------------------------------------
def _compare(expected: str, sent: str, string_to_sign: str) -> None:
    if not hmac.compare_digest(expected.encode(), sent.encode()):
        raise ApiError(
            403,
            "SignatureDoesNotMatch",
            "Specified signature does not match our calculation. "
            f"server string to sign is:{string_to_sign}",
        )


def _bad_time() -> ApiError:
    return ApiError(
        400, "InvalidTimeStamp.Format", "Specified time stamp or date is not well formatted."
    )


def _send_json(h: BaseHTTPRequestHandler, status: int, payload: dict[str, Any], rid: str) -> int:
    data = json.dumps(payload, ensure_ascii=False).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json;charset=utf-8")
    h.send_header("Content-Length", str(len(data)))
    h.send_header("x-acs-request-id", rid)
    h.end_headers()
    h.wfile.write(data)
    return status


def _list_item(view: dict[str, Any], dlc_id: str) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k in LIST_KEYS} | {"DlcJobId": dlc_id}


def _outcome(code: int) -> tuple[str, str | None, str | None]:
    """A command's exit code as the job's final (status, code, message)."""
    if code == 0:
        return "Succeed", None, None
    how = f"was killed by signal {-code}" if code < 0 else f"failed with exit code {code}"
    return "Failed", "JobFailed", f"The training process {how}."


def _instance_count(request: dict[str, Any]) -> int:
    return int(request["ComputeResource"].get("EcsCount", 1))


def _instance_names(job_type: str, count: int) -> list[str]:
    """A job's instances as DLC names them: a TFJob's all workers, else a master first."""
    if job_type == "TFJob":
        return [f"worker-{rank}" for rank in range(count)]
    return ["master-0", *(f"worker-{rank}" for rank in range(count - 1))]


def _distributed(job_type: str, rank: int, hosts: list[str]) -> dict[str, str]:
    """What DLC gives instance ``rank`` of a job whose instances have these host names."""
    env = {
        "MASTER_ADDR": hosts[0],
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(len(hosts)),
        "RANK": str(rank),
        "NPROC_PER_NODE": "1",  # the emulator's instances have no GPU
    }
    if job_type == "TFJob":
        cluster = {"worker": [f"{host}:{MASTER_PORT}" for host in hosts]}
        task = {"type": "worker", "index": rank}
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task, "environment": "cloud"})
    return env


def _official_images(region: str) -> list[dict[str, Any]]:
    images = []
    for index, (name, framework, chip, python) in enumerate(OFFICIAL_IMAGES):
        labels = {
            "system.official": "true",
            "system.origin": "PAI",
            "system.supported.dlc": "true",
            "system.supported.dsw": "true",
            "system.chipType": chip,
            "system.framework": framework,
            "system.pythonVersion": python,
        }
        stamp = f"2023-0{index % 9 + 1}-1{index % 10}T08:00:00Z"
        images.append(
            {
                "ImageId": "image-" + hashlib.sha1(name.encode()).hexdigest()[:18],
                "Name": name,
                "ImageUri": f"dsw-registry-vpc.{region}.cr.aliyuncs.com/pai/{name}",
                "Description": f"PAI official {framework} image ({chip}, Python {python}).",
                "Accessibility": "PUBLIC",
                "WorkspaceId": "0",
                "GmtCreateTime": stamp,
                "GmtModifiedTime": stamp,
                "Labels": [{"Key": k, "Value": v} for k, v in labels.items()],
            }
        )
    return images


def _unsatisfied(lines: Iterable[str]) -> list[str]:
    """The requirement lines this interpreter does not already satisfy (options pass through)."""
    missing = []
    for line in lines:
        text = line.split(" #", 1)[0].strip()
        if not text or text.startswith("#"):
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            missing.append(text)
            continue
        if requirement.marker and not requirement.marker.evaluate():
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if requirement.url or not requirement.specifier.contains(installed, prereleases=True):
            missing.append(text)
    return missing


def _time_limit(request: dict[str, Any]) -> int | None:
    """Scheduler.MaxRunningTimeInSeconds (or ...InMinutes) in seconds; None for no limit."""
    scheduler = request.get("Scheduler") or {}
    minutes = scheduler.get("MaxRunningTimeInMinutes")
    return scheduler.get("MaxRunningTimeInSeconds") or (minutes * 60 if minutes else None)


def _location_uri(location: Any) -> str:
    """``CodeDir`` ({LocationType: oss, LocationValue: {Bucket, Key} or oss://...}) as a URI."""
    if not isinstance(location, dict) or str(location.get("LocationType", "")).lower() != "oss":
        raise _invalid("CodeDir", f"{location!r}: only LocationType oss is supported")
    value = location.get("LocationValue")
    if isinstance(value, str) and value.startswith("oss://"):
        return value
    if isinstance(value, dict) and value.get("Bucket") and value.get("Key") is not None:
        return f"oss://{value['Bucket']}/{value['Key']}"
    raise _invalid("CodeDir.LocationValue", f"{value!r} names no OSS bucket and key")


def _missing(what: str, uri: str, store: ObjectStore) -> tuple[str, str]:
    bucket, _ = split_uri(uri)
    if not store.bucket_exists(bucket):
        return "NoSuchBucket", f"{what}: bucket {bucket} of {uri} does not exist."
    return "NoSuchKey", f"{what}: {uri} does not exist."


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body or b"{}")
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, "InvalidParameter", f"The request body is not valid JSON: {exc}"
        ) from None
    if not isinstance(request, dict):
        raise ApiError(400, "InvalidParameter", "The request body must be a JSON object.")
    return request


def _invalid(name: str, why: str) -> ApiError:
    return ApiError(400, "InvalidParameter", f"The value of parameter {name} is invalid: {why}.")


def _all_str(values: Iterable[Any]) -> bool:
    return all(isinstance(v, str) for v in values)


def _list_of_dicts(request: dict[str, Any], name: str) -> list[dict[str, Any]]:
    value = request.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _invalid(name, "a list of objects is required")
    return value


def _pairs(request: dict[str, Any], name: str, key: str, value: str) -> None:
    for item in _list_of_dicts(request, name):
        if (
            not isinstance(item.get(key), str)
            or not item[key]
            or not isinstance(item.get(value), str)
        ):
            raise _invalid(name, f"{item!r} needs a string {key} and a string {value}")


def _json_labels(text: str | None) -> dict[str, Any]:
    """ListTrainingJobs ``Labels``: the client sends the dict as a JSON object string."""
    try:
        labels = json.loads(text) if text else {}
    except json.JSONDecodeError:
        labels = None
    if not isinstance(labels, dict):
        raise _invalid("Labels", f"{text!r} is not a JSON object of label keys to values")
    return labels


def _has_labels(job: _Job, wanted: dict[str, Any]) -> bool:
    labels = {label["Key"]: label["Value"] for label in job.request.get("Labels") or []}
    return all(labels.get(key) == str(value) for key, value in wanted.items())


def _page(items: list[Any], query: dict[str, str]) -> list[Any]:
    number = _positive(query, "PageNumber", 1)
    size = _positive(query, "PageSize", PAGE_SIZE)
    return items[(number - 1) * size : number * size]


def _positive(query: dict[str, str], name: str, default: int) -> int:
    try:
        value = int(query.get(name) or default)
    except ValueError:
        value = 0
    if value < 1:
        raise _invalid(name, f"{query[name]!r} is not a positive integer")
    return value


def _descending(query: dict[str, str], default: str) -> bool:
    order = (query.get("Order") or default).upper()
    if order not in ("ASC", "DESC"):
        raise _invalid("Order", f"{order} is neither ASC nor DESC")
    return order == "DESC"


def _parse_time(query: dict[str, str], name: str) -> float | None:
    """ISO 8601 UTC (``2024-01-01T00:00Z``, ``...:00Z``, with offset or fraction) -> epoch."""
    text = query.get(name)
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _invalid(name, f"{text!r} is not an ISO 8601 time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _iso(moment: float) -> str:
    """The service's time format: ISO 8601 UTC to the second, ``2024-01-01T00:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def _metric(metric: tuple[str, float, float]) -> dict[str, Any]:
    return {"Name": metric[0], "Value": metric[1], "Timestamp": _iso(metric[2])}


def _latest_metrics(job: _Job) -> list[dict[str, Any]]:
    latest: dict[str, tuple[str, float, float]] = {}
    for metric in job.metrics:
        latest[metric[0]] = metric
    return [_metric(m) for m in latest.values()]


def _is_float(text: str | None) -> bool:
    try:
        float(text or "")
    except ValueError:
        return False
    return True


def _random_id(length: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(length))


__all__ = ["DEFAULT_INSTANCE_TYPES", "OFFICIAL_IMAGES", "ApiError", "PaiServer"]
