"""A fake OpenPAI rest-server (REST API v2) over real HTTP, for backend=openpai's tests.

Routes, as microsoft/pai's rest-server and log-manager serve them (under ``prefix``, e.g.
``/rest-server``, as many clusters do; the log-manager and the web portal at the root):

    GET  /api/v2/info                                    (no token)
    GET  /api/v2/virtual-clusters, GET /api/v2/storages
    POST /api/v2/jobs          job protocol v2 (text/yaml or JSON) -> 202; 409: the name exists
    GET  /api/v2/jobs?username=&keyword=&state=&offset=&limit=
    GET  /api/v2/jobs/{user}~{job}
    PUT  /api/v2/jobs/{user}~{job}/executionType      {"value": "STOP"|"START"}
    GET  /api/v2/jobs/{user}~{job}/attempts/{a}/taskRoles/{role}/taskIndex/{i}/attempts/{t}/logs
    GET  /log-manager/{host:port}/api/v1/logs/{name}?...&token=   a log's content
    GET  /job-detail.html?username=&jobName=                      the web portal's job page

Every /api route but ``info`` needs ``Authorization: Bearer <token>`` of a known user (401
UnauthorizedUserError otherwise); errors are ``{code, message}``. ``faults`` (the PAI
emulator's FaultPlan, kinds ``error`` and ``drop``) answers a share of requests with a 5xx or
drops the connection, half of the drops after the request took effect.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

import yaml
from emulator.common import FaultPlan
from emulator.http_server import ServiceHttpServer

from .cluster import FakeCluster, Job

JOB_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
ROLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PORT_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_LIMIT, MAX_LIMIT = 5000, 50000


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    action: str
    status: int  # 0: the connection was dropped
    fault: str | None


class OpenPaiServer:
    """One fake OpenPAI cluster: ``user`` with ``token``, virtual clusters, storage configs
    (each a directory under ``root/storage``), jobs run as containers labelled ``label``."""

    def __init__(
        self,
        root: Path,
        *,
        user: str = "alice",
        virtual_clusters: tuple[str, ...] = ("default", "gpu"),
        storages: tuple[str, ...] = ("confignfs",),
        prefix: str = "/rest-server",
        faults: FaultPlan | None = None,
        phase_seconds: float = 0.05,
    ) -> None:
        self.root = Path(root)
        self.user = user
        self.token = f"fake-openpai-token-{secrets.token_hex(8)}"
        self.log_token = secrets.token_hex(8)  # the log-manager's own
        self.virtual_clusters = virtual_clusters
        self.prefix = prefix.rstrip("/")
        self.faults = faults or FaultPlan(kinds=("error", "drop"))
        self.label = secrets.token_hex(4)
        storage_dirs = {name: self.root / "storage" / name for name in storages}
        for directory in storage_dirs.values():
            directory.mkdir(parents=True, exist_ok=True)
        self.cluster = FakeCluster(storage_dirs, self.root / "logs", phase_seconds, self.label)
        self.requests: list[Request] = []
        self.submissions: Counter[str] = Counter()  # job name -> jobs created (never > 1)
        self._lock = threading.Lock()
        self._errors = 0
        self._httpd: _HttpServer | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> OpenPaiServer:
        self._httpd = _HttpServer(("127.0.0.1", 0), self)
        threading.Thread(target=self._httpd.serve_forever, name="openpai", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop every job and remove every container, then stop serving."""
        self.cluster.shutdown()
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd.close_connections()
            self._httpd = None

    def __enter__(self) -> OpenPaiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def uri(self) -> str:
        """The web portal: ``http://127.0.0.1:PORT``."""
        assert self._httpd is not None, "the fake OpenPAI server is not running"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def rest_server_uri(self) -> str:
        return self.uri + self.prefix

    def storage_dir(self, name: str) -> Path:
        """A storage config's directory: mounted at /mnt/<name> in jobs, and on 'this machine'."""
        return self.cluster.storages[name]

    def jobs(self) -> list[dict[str, Any]]:
        """Every job as the listing shows it, oldest first."""
        with self.cluster.lock:
            return [job.summary() for job in self.cluster.jobs.values()]

    def job(self, name: str) -> dict[str, Any]:
        with self.cluster.lock:
            return self.cluster.jobs[f"{self.user}~{name}"].detail()

    def protocol(self, name: str) -> dict[str, Any]:
        """The job protocol the cluster received for a job."""
        with self.cluster.lock:
            return dict(self.cluster.jobs[f"{self.user}~{name}"].protocol)

    def log(self, name: str, index: int = 0) -> bytes:
        """The output so far of a job's task ``index`` in its latest attempt (b"" before it
        started)."""
        with self.cluster.lock:
            job = self.cluster.jobs.get(f"{self.user}~{name}")
            task = job.attempts[-1][index] if job and job.attempts else None
        return self.cluster.log(task, "all") if task else b""

    def containers(self) -> list[dict[str, Any]]:
        """This cluster's containers that exist now."""
        from .cluster import LABEL

        return list(
            self.cluster.api.containers(all=True, filters={"label": f"{LABEL}={self.label}"})
        )

    def networks(self) -> list[dict[str, Any]]:
        """This cluster's networks (one per attempt of a job) that exist now."""
        from .cluster import LABEL

        return list(self.cluster.api.networks(filters={"label": f"{LABEL}={self.label}"}))

    def records(self, action: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if action in (None, r.action)]

    # -- requests --------------------------------------------------------------------------

    def handle(self, h: _Handler) -> None:
        raw_path, _, raw_query = h.path.partition("?")
        path = unquote(raw_path)
        query = dict(parse_qsl(raw_query, keep_blank_values=True))
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        action, handler, args = self._route(h.command, path)
        fault, after = self.faults.draw() if action != "Portal" else (None, False)
        if fault == "error":
            code, reply, content_type = self._server_error()
        elif fault == "drop" and not after:
            code, reply, content_type = 0, b"", ""  # not processed
        else:
            code, reply, content_type = self._answer(h, action, handler, args, query, body)
        status = 0 if fault == "drop" else code
        with self._lock:  # recorded before the client can see a reply
            self.requests.append(Request(h.command, path, query, action, status, fault))
        if status:
            _send(h, status, reply, content_type)
        else:
            h.close_connection = True

    def _answer(
        self,
        h: _Handler,
        action: str,
        handler: Any,
        args: dict[str, str],
        query: dict[str, str],
        body: bytes,
    ) -> tuple[int, Any, str]:
        try:
            if action not in ("Info", "Portal", "LogContent"):
                self._authenticate(h.headers.get("Authorization") or "")
            result: tuple[int, Any, str] = handler(query, body, h.headers, **args)
            return result
        except ApiError as exc:
            return exc.status, {"code": exc.code, "message": exc.message}, "application/json"
        except Exception as exc:  # a bug of the fake: answer as the rest-server would, loudly
            traceback.print_exc()
            return 500, {"code": "UnknownError", "message": repr(exc)}, "application/json"

    def _server_error(self) -> tuple[int, Any, str]:
        with self._lock:
            self._errors += 1
            code = (500, 502, 503)[self._errors % 3]
        return (
            code,
            {"code": "UnknownError", "message": "Internal error message."},
            "application/json",
        )

    def _authenticate(self, header: str) -> None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), self.token):
            raise ApiError(
                401, "UnauthorizedUserError", "Guest is not allowed to do this operation."
            )

    def _route(self, method: str, path: str) -> tuple[str, Any, dict[str, str]]:
        api = re.escape(self.prefix) + r"/api/v2"
        job = api + r"/jobs/(?P<framework>[^/]+~[^/]+)"
        table = [
            ("GET", api + r"/info", "Info", self._info),
            ("GET", api + r"/virtual-clusters", "ListVirtualClusters", self._virtual_clusters),
            ("GET", api + r"/storages", "ListStorages", self._storages),
            ("POST", api + r"/jobs", "SubmitJob", self._submit),
            ("GET", api + r"/jobs", "ListJobs", self._list),
            ("GET", job, "GetJob", self._get),
            ("PUT", job + r"/executionType", "ExecutionType", self._execute),
            (
                "GET",
                job + r"/attempts/(?P<attempt>\d+)/taskRoles/(?P<role>[^/]+)/taskIndex/"
                r"(?P<index>\d+)/attempts/(?P<task_attempt>\d+)/logs",
                "JobLogs",
                self._log_locations,
            ),
            ("GET", r"/log-manager/[^/]+/api/v1/logs/(?P<kind>[^/]+)", "LogContent", self._log),
            ("GET", r"/job-detail\.html", "Portal", self._portal),
        ]
        for route_method, pattern, action, handler in table:
            found = re.fullmatch(pattern + "/?", path)
            if found and route_method == method:
                return action, handler, found.groupdict()
        return "Unknown", self._no_api, {}

    # -- handlers: (status, reply, content type) -------------------------------------------

    def _no_api(self, *_: Any) -> tuple[int, Any, str]:
        raise ApiError(404, "NoApiError", "The API does not exist.")

    def _info(self, *_: Any) -> tuple[int, Any, str]:
        reply = {"name": "PAI RESTful API", "version": "v1.8.0", "launcherType": "k8s"}
        return 200, {**reply, "authnMethod": "basic"}, "application/json"

    def _virtual_clusters(self, *_: Any) -> tuple[int, Any, str]:
        share = 100 / len(self.virtual_clusters)
        reply = {
            vc: {"capacity": share, "maxCapacity": share, "dedicated": False}
            for vc in self.virtual_clusters
        }
        return 200, reply, "application/json"

    def _storages(self, *_: Any) -> tuple[int, Any, str]:
        names = list(self.cluster.storages)
        storages = [
            {"name": n, "share": True, "volumeName": f"{n}-pv", "default": i == 0}
            for i, n in enumerate(names)
        ]
        return 200, {"storages": storages}, "application/json"

    def _submit(self, query: dict[str, str], body: bytes, headers: Any) -> tuple[int, Any, str]:
        try:
            protocol = yaml.safe_load(body.decode())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ApiError(400, "InvalidProtocolError", f"Invalid job protocol: {exc}") from None
        name = _check_protocol(protocol)
        vc = (protocol.get("defaults") or {}).get("virtualCluster", "default")
        if vc not in self.virtual_clusters:
            raise ApiError(400, "NoVirtualClusterError", f"Virtual cluster {vc} is not found.")
        job = Job(self.user, name, protocol, time.time())
        with self.cluster.lock:
            if job.framework in self.cluster.jobs:
                raise ApiError(409, "ConflictJobError", f"Job {job.framework} already exists.")
            self.cluster.jobs[job.framework] = job
            self.submissions[name] += 1
        self.cluster.start(job)
        message = f"Update job {name} for user {self.user} successfully."
        return 202, {"status": 202, "message": message}, "application/json"

    def _list(self, query: dict[str, str], *_: Any) -> tuple[int, Any, str]:
        limit = int(query.get("limit", DEFAULT_LIMIT))
        if limit > MAX_LIMIT:
            raise ApiError(400, "InvalidParametersError", f"Limit exceeds max number {MAX_LIMIT}.")
        users = query["username"].split(",") if "username" in query else None
        states = query["state"].split(",") if "state" in query else None
        keyword = query.get("keyword", "")
        with self.cluster.lock:
            jobs = [
                job.summary()
                for job in self.cluster.jobs.values()
                if (users is None or job.user in users)
                and (states is None or job.state in states)
                and any(
                    keyword in text
                    for text in (job.user, job.name, job.summary()["virtualCluster"])
                )
            ]
        jobs.sort(key=lambda j: j["createdTime"], reverse=True)
        offset = int(query.get("offset", 0))
        return 200, jobs[offset : offset + limit], "application/json"

    def _job(self, framework: str) -> Job:
        with self.cluster.lock:
            job = self.cluster.jobs.get(framework)
        if job is None:
            raise ApiError(404, "NoJobError", f"Job {framework} is not found.")
        return job

    def _get(
        self, query: dict[str, str], body: bytes, headers: Any, framework: str
    ) -> tuple[int, Any, str]:
        job = self._job(framework)
        with self.cluster.lock:
            return 200, job.detail(), "application/json"

    def _execute(
        self, query: dict[str, str], body: bytes, headers: Any, framework: str
    ) -> tuple[int, Any, str]:
        job = self._job(framework)
        try:
            value = json.loads(body or b"{}").get("value")
        except ValueError:
            value = None
        if value not in ("START", "STOP"):
            raise ApiError(400, "InvalidParametersError", '"value" must be one of [START, STOP]')
        if value == "STOP":
            self.cluster.stop(job)
        return (
            202,
            {"status": 202, "message": f"Execute job {framework} successfully."},
            "application/json",
        )

    def _log_locations(
        self,
        query: dict[str, str],
        body: bytes,
        headers: Any,
        framework: str,
        attempt: str,
        role: str,
        index: str,
        task_attempt: str,
    ) -> tuple[int, Any, str]:
        job = self._job(framework)
        with self.cluster.lock:
            attempts = job.attempts
            tasks = attempts[int(attempt)] if int(attempt) < len(attempts) else []
            task = next((t for t in tasks if t.index == int(index)), None)
            started = task is not None and task.container is not None and job.role == role
        if not started or task_attempt != "0":
            raise ApiError(404, "NoTaskLogError", "Log of task is not found.")
        assert task is not None
        host = self.uri.removeprefix("http://")
        params = {
            "username": job.user,
            "framework-name": job.framework,
            "taskrole": role,
            "pod-uid": task.pod_uid,
            "token": self.log_token,
        }
        locations = [
            {
                "name": kind,
                "uri": f"/log-manager/{host}/api/v1/logs/user-{kind}?{urlencode(params)}",
            }
            for kind in ("all", "stdout", "stderr")
        ]
        return 200, {"locations": locations}, "application/json"

    def _log(
        self, query: dict[str, str], body: bytes, headers: Any, kind: str
    ) -> tuple[int, Any, str]:
        if not secrets.compare_digest(query.get("token", ""), self.log_token):
            raise ApiError(403, "Forbidden", "invalid log-manager token")
        kind = kind.removeprefix("user-")
        with self.cluster.lock:
            job = self.cluster.jobs.get(query.get("framework-name", ""))
            tasks = [t for attempt in (job.attempts if job else []) for t in attempt]
            task = next((t for t in tasks if t.pod_uid == query.get("pod-uid")), None)
        if job is None or task is None or kind not in ("all", "stdout", "stderr"):
            raise ApiError(404, "NotFound", "log not found")
        return 200, self.cluster.log(task, kind), "text/plain"

    def _portal(self, query: dict[str, str], *_: Any) -> tuple[int, Any, str]:
        name = quote(query.get("jobName", ""))
        return 200, f"<html><body>job {name}</body></html>".encode(), "text/html"


def _check_protocol(protocol: Any) -> str:
    """What the rest-server's protocol validation refuses (400 InvalidProtocolError); the name."""

    def invalid(why: str) -> ApiError:
        return ApiError(400, "InvalidProtocolError", f"Invalid job protocol: {why}")

    if not isinstance(protocol, dict):
        raise invalid("not a mapping")
    if str(protocol.get("protocolVersion")) != "2":
        raise invalid("protocolVersion must be 2")
    name = protocol.get("name")
    if not isinstance(name, str) or not JOB_NAME.match(name):
        raise invalid("name must match ^[a-zA-Z0-9_-]+$")
    if protocol.get("type") != "job":
        raise invalid('type must be "job"')
    images = {
        p.get("name"): p
        for p in protocol.get("prerequisites") or []
        if isinstance(p, dict) and p.get("type") == "dockerimage" and p.get("uri")
    }
    roles = protocol.get("taskRoles")
    if not isinstance(roles, dict) or len(roles) != 1:
        raise invalid("taskRoles: the fake cluster runs jobs of one task role")
    for role, spec in roles.items():
        if not ROLE_NAME.match(str(role)) or not isinstance(spec, dict):
            raise invalid(f"taskRoles.{role}: invalid task role")
        if spec.get("dockerImage") not in images:
            raise invalid(f"taskRoles.{role}.dockerImage must name a dockerimage prerequisite")
        resources = spec.get("resourcePerInstance") or {}
        if not all(
            isinstance(resources.get(k), int) and resources[k] >= 1 for k in ("cpu", "memoryMB")
        ):
            raise invalid(f"taskRoles.{role}.resourcePerInstance needs cpu and memoryMB >= 1")
        commands = spec.get("commands")
        if not commands or not all(isinstance(c, str) for c in commands):
            raise invalid(f"taskRoles.{role}.commands must be a list of strings")
        if int(spec.get("instances", 1)) < 1:
            raise invalid(f"taskRoles.{role}.instances must be >= 1")
        ports = resources.get("ports") or {}
        if not all(
            PORT_LABEL.match(str(k)) and isinstance(n, int) and n >= 1 for k, n in ports.items()
        ):
            raise invalid(f"taskRoles.{role}.resourcePerInstance.ports: label -> count >= 1")
        for key, value in (spec.get("completion") or {}).items():
            if key not in ("minFailedInstances", "minSucceededInstances") or not (
                isinstance(value, int) and (value == -1 or value >= 1)
            ):
                raise invalid(f"taskRoles.{role}.completion.{key} must be -1 or >= 1")
    if int(protocol.get("jobRetryCount") or 0) < 0:
        raise invalid("jobRetryCount must be >= 0")
    return name


def _send(h: BaseHTTPRequestHandler, status: int, reply: Any, content_type: str) -> None:
    data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


class _HttpServer(ServiceHttpServer):
    def __init__(self, address: tuple[str, int], fake: OpenPaiServer) -> None:
        self.fake = fake
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def do_GET(self) -> None:
        self.server.fake.handle(self)

    do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        """Requests go to ``requests``, not stderr."""
