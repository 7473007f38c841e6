"""The fake cluster behind the fake rest-server: each job's task role instances are real Docker
containers of the job's image, with each storage config the job mounts bind-mounted at
``/mnt/<name>``, as OpenPAI's ``teamwise_storage`` runtime plugin does.

A job walks FrameworkController's states (AttemptCreationPending -> AttemptPreparing ->
AttemptRunning -> [AttemptDeletionRequested] -> AttemptCompleted -> Completed) and shows them
as the rest-server does (WAITING, RUNNING, STOPPING, STOPPED, SUCCEEDED, FAILED), with exit
codes, phrases and diagnostics from OpenPAI's exit spec. ``jobRetryCount`` starts new attempts
of a failed job. A task role of N instances is N containers on a network made for the
attempt (removed with it), each with OpenPAI's variables (:mod:`.taskrole`); the role's
completion policy ends the attempt, the tasks still running then stopped. Logs are the
containers' stdout/stderr, kept in files once a container is collected; a container is
removed before its job is shown as ended, and on ``shutdown``.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .taskrole import (
    RUNTIME_DIR,
    Completion,
    publish_hosts,
    reserve_ports,
    task_environment,
    wait_for_hosts,
)

LABEL = "paiexp-test.openpai"  # every container of a fake cluster: its id
STOP_CODE = -210  # StopFrameworkRequested
POLICY_CODE = -220  # FrameworkAttemptCompletion: a task stopped as its attempt completed
# A subset of OpenPAI's k8s-job-exit-spec.yaml: code -> (phrase, type).
EXIT_SPEC: dict[int, tuple[str, str]] = {
    0: ("Succeeded", "USER_SUCCESS"),
    STOP_CODE: ("StopFrameworkRequested", "USER_STOP"),
    POLICY_CODE: ("FrameworkAttemptCompletion", "USER_STOP"),
    -1200: ("UserContainerDockerOOMKilled", "USER_FAILURE"),
    137: ("ContainerSigKillReceived", "PLATFORM_FAILURE"),
    143: ("ContainerSigTermReceived", "PLATFORM_FAILURE"),
    254: ("ContainerImageNotExists", "USER_FAILURE"),
    255: ("PAIRuntimeUnknownFailed", "UNKNOWN_FAILURE"),
}
SECRET = re.compile(r"<%\s*\$(secrets|parameters)\.([A-Za-z0-9_.-]+)\s*%>")
KILL_GRACE = 2  # seconds between a stop's SIGTERM and SIGKILL


def convert_state(sub_state: str, code: int | None) -> str:
    """The rest-server's job state for a framework state and exit code (frameworkConverter)."""
    if sub_state in ("AttemptCreationPending", "AttemptCreationRequested", "AttemptPreparing"):
        return "WAITING"
    if sub_state == "AttemptRunning":
        return "RUNNING"
    if sub_state in ("AttemptDeletionPending", "AttemptDeletionRequested", "AttemptDeleting"):
        return "STOPPING" if code in (STOP_CODE, POLICY_CODE) else "RUNNING"
    if sub_state == "AttemptCompleted":
        return "WAITING"  # a retry is coming
    if sub_state == "Completed":
        return (
            "SUCCEEDED"
            if code == 0
            else "STOPPED"
            if code in (STOP_CODE, POLICY_CODE)
            else "FAILED"
        )
    return "UNKNOWN"


def exit_spec(code: int) -> dict[str, Any]:
    phrase, kind = EXIT_SPEC.get(code, ("PAIRuntimeExitAbnormally", "PLATFORM_FAILURE"))
    return {"code": code, "phrase": phrase, "type": kind}


@dataclass
class Task:
    index: int
    pod_uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    container: str | None = None
    ip: str | None = None  # on the attempt's network, once started
    exit_code: int | None = None
    ended_by_policy: bool = False  # stopped because its attempt completed
    log_dir: Path | None = None  # the collected logs: all, stdout, stderr

    @property
    def state(self) -> str:
        if self.exit_code is None:
            return "RUNNING" if self.container else "WAITING"
        return convert_state("Completed", self.exit_code)


@dataclass
class Job:
    user: str
    name: str
    protocol: dict[str, Any]
    created: float
    sub_state: str = "AttemptCreationPending"
    execution_type: str = "START"
    code: int | None = None
    diagnostics: str | None = None
    trigger: tuple[int, str] | None = None  # the task that ended the attempt, and why
    completed: float | None = None
    attempts: list[list[Task]] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def framework(self) -> str:
        return f"{self.user}~{self.name}"

    @property
    def role(self) -> str:
        return next(iter(self.protocol["taskRoles"]))

    @property
    def state(self) -> str:
        return convert_state(self.sub_state, self.code)

    def summary(self) -> dict[str, Any]:
        """As ``GET /api/v2/jobs`` lists it."""
        roles = self.protocol["taskRoles"].values()
        return {
            "debugId": hashlib.md5(self.framework.encode()).hexdigest(),
            "name": self.name,
            "username": self.user,
            "state": self.state,
            "subState": self.sub_state,
            "executionType": self.execution_type,
            "retries": max(0, len(self.attempts) - 1),
            "retryDetails": {"user": max(0, len(self.attempts) - 1), "platform": 0, "resource": 0},
            "retryDelayTime": None,
            "createdTime": int(self.created * 1000),
            "completedTime": int(self.completed * 1000) if self.completed else None,
            "appExitCode": self.code,
            "virtualCluster": (self.protocol.get("defaults") or {}).get(
                "virtualCluster", "default"
            ),
            "totalGpuNumber": sum(r["resourcePerInstance"].get("gpu", 0) for r in roles),
            "totalTaskNumber": sum(r.get("instances", 1) for r in roles),
            "totalTaskRoleNumber": len(self.protocol["taskRoles"]),
        }

    def detail(self) -> dict[str, Any]:
        """As ``GET /api/v2/jobs/{user}~{name}`` shows it."""
        summary = self.summary()
        status = {k: v for k, v in summary.items() if k not in ("name", "debugId")}
        ended = self.sub_state == "Completed"
        status.update(
            appId=summary["debugId"],
            appProgress=1 if ended else 0,
            appTrackingUrl="",
            appLaunchedTime=summary["createdTime"],
            appCompletedTime=summary["completedTime"],
            appExitSpec=exit_spec(self.code) if self.code is not None else None,
            appExitDiagnostics=self.diagnostics,
            appExitMessages={"container": None, "runtime": None, "launcher": self.diagnostics}
            if self.diagnostics
            else None,
            appExitTriggerMessage=self.trigger[1] if ended and self.trigger else None,
            appExitTriggerTaskRoleName=self.role if ended and self.trigger else None,
            appExitTriggerTaskIndex=self.trigger[0] if ended and self.trigger else None,
            appExitType=exit_spec(self.code)["type"] if self.code is not None else None,
        )
        tasks = self.attempts[-1] if self.attempts else []
        return {
            "debugId": summary["debugId"],
            "name": self.name,
            "jobStatus": status,
            "taskRoles": {
                self.role: {
                    "taskRoleStatus": {"name": self.role},
                    "taskStatuses": [
                        {
                            "taskIndex": task.index,
                            "taskState": task.state,
                            "containerId": task.pod_uid,
                            "containerIp": task.ip,
                            "containerExitCode": task.exit_code,
                        }
                        for task in tasks
                    ],
                }
            },
        }


class FakeCluster:
    """Runs jobs as containers; ``storages`` maps a storage config's name to its host dir."""

    def __init__(
        self, storages: dict[str, Path], logs: Path, phase_seconds: float, label: str
    ) -> None:
        import docker

        self.storages = storages
        self.logs = logs
        self.phase_seconds = phase_seconds
        self.label = label
        self.api = docker.from_env().api
        self.cpus = int(self.api.info()["NCPU"])
        self.lock = threading.RLock()
        self.jobs: dict[str, Job] = {}
        self.threads: list[threading.Thread] = []

    def start(self, job: Job) -> None:
        thread = threading.Thread(target=self._run, args=(job,), daemon=True)
        self.threads.append(thread)
        thread.start()

    def stop(self, job: Job) -> None:
        """``executionType: STOP``: STOPPING while its containers are stopped, then STOPPED."""
        with self.lock:
            if job.sub_state == "Completed" or job.stopped.is_set():
                return
            job.execution_type = "STOP"
            job.stopped.set()
            if job.sub_state == "AttemptRunning":
                job.sub_state, job.code = "AttemptDeletionRequested", STOP_CODE
            containers = [t.container for t in (job.attempts[-1] if job.attempts else [])]
        for container in filter(None, containers):
            threading.Thread(target=self._kill, args=(container,), daemon=True).start()

    def shutdown(self) -> None:
        with self.lock:
            jobs = list(self.jobs.values())
        for job in jobs:
            self.stop(job)
        for thread in self.threads:
            thread.join(timeout=KILL_GRACE + 10)
        for container in self.api.containers(all=True, filters={"label": f"{LABEL}={self.label}"}):
            self.api.remove_container(container["Id"], force=True)
        for network in self.api.networks(filters={"label": f"{LABEL}={self.label}"}):
            self.api.remove_network(network["Id"])

    def log(self, task: Task, kind: str) -> bytes:
        """A task's log (``all``, ``stdout`` or ``stderr``): its file once collected."""
        with self.lock:
            log_dir, container = task.log_dir, task.container
        if log_dir is not None:
            return (log_dir / kind).read_bytes()
        if container is None:
            return b""
        from docker.errors import NotFound

        streams = {"all": (True, True), "stdout": (True, False), "stderr": (False, True)}[kind]
        try:
            return bytes(self.api.logs(container, stdout=streams[0], stderr=streams[1]))
        except NotFound:  # collected meanwhile: its logs are in their files now
            with self.lock:
                log_dir = task.log_dir
            return (log_dir / kind).read_bytes() if log_dir else b""

    # -- a job's life ----------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        retries = int(job.protocol.get("jobRetryCount") or 0)
        for attempt in range(retries + 1):
            code, diagnostics = self._attempt(job, attempt)
            if code == 0 or job.stopped.is_set() or attempt == retries:
                break
            with self.lock:
                job.sub_state = "AttemptCompleted"
            time.sleep(self.phase_seconds)
        with self.lock:
            if job.stopped.is_set():
                code, diagnostics = STOP_CODE, "User has requested to stop the job"
            job.code, job.diagnostics = code, diagnostics
            job.sub_state, job.completed = "Completed", time.time()

    def _attempt(self, job: Job, attempt: int) -> tuple[int, str | None]:
        role = job.protocol["taskRoles"][job.role]
        tasks = [Task(index) for index in range(int(role.get("instances", 1)))]
        with self.lock:
            job.attempts.append(tasks)
            job.sub_state, job.code, job.trigger = "AttemptCreationPending", None, None
        time.sleep(self.phase_seconds)
        with self.lock:
            if job.stopped.is_set():
                return STOP_CODE, None
            job.sub_state = "AttemptPreparing"
        problem = self._cannot_launch(job)
        if problem is not None:
            return problem
        runtime = self.logs / job.framework / f"{attempt}-runtime"  # the tasks' addresses
        runtime.mkdir(parents=True)
        network = self.api.create_network(
            f"openpai-{self.label}-{uuid.uuid4().hex[:8]}-{attempt}",
            driver="bridge",
            labels={LABEL: self.label, "openpai.job": job.framework},
        )["Id"]
        try:
            ports = reserve_ports(role, len(tasks))
            for task in tasks:
                container = self._create(job, attempt, task, network, ports, runtime)
                with self.lock:
                    task.container = container
                    stopped = job.stopped.is_set()
                if not stopped:
                    self.api.start(container)
            with self.lock:
                if not job.stopped.is_set():
                    job.sub_state = "AttemptRunning"
            addresses = [self._address(task, network) for task in tasks]
            with self.lock:
                for task, address in zip(tasks, addresses, strict=True):
                    task.ip = address or None
            publish_hosts(runtime, job.role, addresses)
            return self._complete(job, attempt, tasks, Completion.of(role))
        finally:
            for task in tasks:  # never started (a stop came first): collected by nobody
                if task.container and task.exit_code is None:
                    self.api.remove_container(task.container, force=True)
            self.api.remove_network(network)

    def _address(self, task: Task, network: str) -> str:
        """A task's IP on the attempt's network ("" if it never started)."""
        assert task.container is not None
        settings = self.api.inspect_container(task.container)["NetworkSettings"]["Networks"]
        return str(next(iter(settings.values()), {}).get("IPAddress") or "")

    def _complete(
        self, job: Job, attempt: int, tasks: list[Task], completion: Completion
    ) -> tuple[int, str | None]:
        """Collect the tasks as they exit until the completion policy ends the attempt; then
        stop the others. The attempt's exit code and diagnostics."""
        exits: queue.Queue[int] = queue.Queue()
        for task in tasks:
            threading.Thread(target=self._await, args=(task, exits), daemon=True).start()
        codes: dict[int, int] = {}
        result: tuple[int, str | None] | None = None
        while len(codes) < len(tasks):
            index = exits.get()
            codes[index] = self._collect(job, attempt, tasks[index])
            verdict = completion.verdict(codes, len(tasks)) if result is None else None
            if verdict is None:
                continue
            succeeded, why = verdict
            result = (0, None) if succeeded else _failure(codes[index])
            with self.lock:
                job.trigger = (index, f"{why}: triggered by Task [{job.role}][{index}]")
                others = [t for t in tasks if t.index not in codes]
                for task in others:
                    task.ended_by_policy = True
            for task in others:
                threading.Thread(target=self._kill, args=(task.container,), daemon=True).start()
        assert result is not None
        return result

    def _await(self, task: Task, exits: queue.Queue[int]) -> None:
        """Tell ``exits`` when the task's container has exited (at once if it never started)."""
        import docker

        assert task.container is not None
        api = docker.from_env().api  # a client of its own: this call blocks
        try:
            if api.inspect_container(task.container)["State"]["Status"] != "created":
                api.wait(task.container)
        finally:
            api.close()
            exits.put(task.index)

    def _cannot_launch(self, job: Job) -> tuple[int, str] | None:
        from docker.errors import ImageNotFound

        image = job.protocol["prerequisites"][0]["uri"]
        try:
            self.api.inspect_image(image)
        except ImageNotFound:
            return 254, f"Pull access denied for {image}, repository does not exist"
        for name in self._storage_names(job):
            if name not in self.storages:
                return 255, f"teamwise_storage: storage config {name} is not found"
        return None

    def _storage_names(self, job: Job) -> list[str]:
        plugins = (job.protocol.get("extras") or {}).get("com.microsoft.pai.runtimeplugin") or []
        return [
            name
            for plugin in plugins
            if plugin.get("plugin") == "teamwise_storage"
            for name in (plugin.get("parameters") or {}).get("storageConfigNames") or []
        ]

    def _create(
        self,
        job: Job,
        attempt: int,
        task: Task,
        network: str,
        ports: list[dict[str, list[int]]],
        runtime: Path,
    ) -> str:
        from docker.types import Mount

        role = job.protocol["taskRoles"][job.role]
        resources = role["resourcePerInstance"]
        values = {**(job.protocol.get("parameters") or {}), **(job.protocol.get("secrets") or {})}
        script = SECRET.sub(lambda m: str(values.get(m.group(2), "")), "\n".join(role["commands"]))
        mounts = [
            Mount(f"/mnt/{name}", str(self.storages[name]), type="bind")
            for name in self._storage_names(job)
        ]
        mounts.append(Mount(str(RUNTIME_DIR), str(runtime), type="bind", read_only=True))
        env = {
            "PAI_USER_NAME": job.user,
            "PAI_JOB_NAME": job.framework,
            **task_environment(job.role, role, task.index, ports),
            "TINI_KILL_PROCESS_GROUP": "1",
        }
        memory = int(resources["memoryMB"]) << 20
        host_config = self.api.create_host_config(
            mounts=mounts,
            init=True,
            nano_cpus=int(min(int(resources["cpu"]), self.cpus) * 1e9),
            mem_limit=memory,
            memswap_limit=memory,
            network_mode=network,
        )
        created = self.api.create_container(
            job.protocol["prerequisites"][0]["uri"],
            command=["/bin/sh", "-c", wait_for_hosts(script)],
            environment=env,
            labels={LABEL: self.label, "openpai.job": job.framework},
            host_config=host_config,
            name=f"openpai-{self.label}-{uuid.uuid4().hex[:8]}-{attempt}-{task.index}",
        )
        return str(created["Id"])

    def _collect(self, job: Job, attempt: int, task: Task) -> int:
        """Keep an exited task's logs, remove its container; its exit code (-220 for a task
        stopped because its attempt completed, -210 for one a stop of the job ended)."""
        assert task.container is not None
        state = self.api.inspect_container(task.container)["State"]
        started = state["Status"] != "created"
        log_dir = self.logs / job.framework / f"{attempt}-{task.index}"
        log_dir.mkdir(parents=True, exist_ok=True)
        for kind, (out, err) in {"all": (1, 1), "stdout": (1, 0), "stderr": (0, 1)}.items():
            data = self.api.logs(task.container, stdout=bool(out), stderr=bool(err))
            (log_dir / f".{kind}").write_bytes(data)
            (log_dir / f".{kind}").rename(log_dir / kind)
        code = -1200 if state.get("OOMKilled") else int(state["ExitCode"])
        with self.lock:
            if task.ended_by_policy and code != 0:
                code = POLICY_CODE
            elif not started or (job.stopped.is_set() and code != 0):
                code = STOP_CODE
            task.log_dir, task.exit_code = log_dir, code
        self.api.remove_container(task.container, force=True)
        return code

    def _kill(self, container: str) -> None:
        from docker.errors import APIError

        with contextlib.suppress(APIError):  # gone already
            self.api.stop(container, timeout=KILL_GRACE)


def _failure(code: int) -> tuple[int, str]:
    """A failed attempt's exit code and diagnostics, from its failed task's exit code."""
    if code in EXIT_SPEC:
        return code, f"Pod failed: container app exited with code {code}"
    return 255, f"Pod failed: user command exited with code {code}"
