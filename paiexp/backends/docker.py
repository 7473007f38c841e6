"""Docker backend: each job in a local container laid out exactly like a PAI training job.

The container sees the real ``/ml`` paths of the PAI contract, bind-mounted from the job's
directory: ``/ml/usercode`` (a copy of the source dir, the working directory; ``/ml/code`` too),
``/ml/input/config``, ``/ml/input/data/<channel>`` (local inputs, read-only) and
``/ml/output/<channel>``. Its CPU and memory limits (and GPU request) come from
``job.instance_type``. The container runs detached, so it survives the launcher; its entry
script (docker_entry.py) installs the requirements, runs the command with ``sh -c``, enforces
``max_run_time`` and writes the log to the job's directory, where it outlives the container.
Once a container has ended, the first ``poll`` that sees it records its outcome in
``state.json``, copies outputs to local destinations and removes it. Layout::

    <root>/<job name>/spec.json        the JobSpec (secrets redacted)
                      resources.json   the container's limits, and where they come from
                      container        the container's id: it was created (never twice)
                      stop             a stop was asked
                      state.json       the job's outcome, once collected
                      ml/usercode, ml/input/config, ml/output/<channel>
                      paiexp/entry.sh  the container's entry point (mounted at /paiexp)
                      paiexp/job.log   the job's output
                      paiexp/failure   why the entry script gave up, if it did
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paiexp.backends.base import JobHandle, JobRejected, JobState, JobStatus, LogChunk
from paiexp.backends.checks import (
    check_local_job,
    check_process_settings,
    check_root,
    oss_channels,
)
from paiexp.backends.docker_entry import entry_script
from paiexp.backends.docker_group import InstanceGroups, ended
from paiexp.backends.docker_instances import (
    CONTAINER_FILE,
    INSTANCE_LABEL,
    Instance,
    addresses,
    instances,
    lay_out_instances,
    load_topology,
)
from paiexp.backends.docker_outcome import killed_from_outside, outcome, timestamp
from paiexp.backends.instance_types import Resources, resolve
from paiexp.backends.jobdir import JobDirectories, LocalResults, read_log_file
from paiexp.backends.threads import cpu_share, thread_environment
from paiexp.cloud.oss import OssTransfer, OssUri, endpoint_url
from paiexp.config.spec import JobSpec
from paiexp.contract import job_mlflow
from paiexp.contract import layout as contract
from paiexp.contract.distributed import Topology, job_type
from paiexp.errors import UserError
from paiexp.util.cache import cache_root
from paiexp.util.confine import persist_outputs
from paiexp.util.jsonfiles import read_json, write_json_atomic
from paiexp.util.retry import RetryPolicy

log = logging.getLogger(__name__)

JOB_LABEL = "paiexp.job"
ROOT_LABEL = "paiexp.root"
RUNNING_STATES = ("running", "paused", "restarting", "removing")
PACKAGE_HINT = "backend=docker needs the docker package: pip install 'paiexp[docker]'"
IMAGE_HINT = "build the test image with: bash tests/images/build.sh (it prints the tag)"


class DockerBackend(LocalResults):
    name = "docker"

    def __init__(self, config: Any, base_dir: Path) -> None:
        self.install_requirements = check_process_settings(config)
        resolve(None, config.cpus, config.memory, config.gpus)  # the overrides' own checks
        self.root = check_root(config.root, base_dir)
        self.jobs = JobDirectories(self.root)
        self.image = config.image
        self.poll_interval = float(config.poll_interval)
        self.stop_grace_period = float(config.stop_grace_period)
        self.keep_containers = bool(config.keep_containers)
        self.cpus, self.memory, self.gpus = config.cpus, config.memory, config.gpus
        self.network = config.network
        self.oss_config = config.oss
        self._oss: OssTransfer | None = None
        self.concurrency = 1
        self._root_key = hashlib.sha256(str(self.root).encode()).hexdigest()[:8]
        self._client: Any = None
        self._engine_cpus: int | None = None
        self._changed = threading.Event()  # set by the events thread when a container dies
        self.died: set[str] = set()  # containers it saw die (the list may lag behind)
        self._watcher: threading.Thread | None = None
        self.groups = InstanceGroups(self)

    # -- the engine --------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The Docker client (``docker.DockerClient``), connected on first use."""
        if self._client is None:
            self._client = connect()
        return self._client

    @property
    def engine_cpus(self) -> int:
        if self._engine_cpus is None:
            self._engine_cpus = int(self.client.info()["NCPU"])
        return self._engine_cpus

    def job_dir(self, name: str) -> Path:
        return self.jobs.path(name)

    def container_name(self, name: str) -> str:
        """Deterministic from the job name (and this backend's root: projects never clash)."""
        return f"paiexp-{name}-{self._root_key}"

    def _handle(self, name: str) -> JobHandle:
        return JobHandle(name=name, id=self.container_name(name))

    # -- validate ----------------------------------------------------------------------------

    def validate(self, spec: JobSpec) -> None:
        for channel, uri in oss_channels(spec.inputs).items():
            self._check_oss_input(channel, uri)
        check_local_job(spec, self.name)
        if spec.instance_count > 1 and self.network:
            raise UserError(
                f"backend.network: a job of job.instance_count={spec.instance_count} runs on "
                f"a network of its own, got {self.network!r}; expected null"
            )
        resources = self._resources(spec)
        image = self._image(spec)
        if resources.cpus is not None and resources.cpus > self.engine_cpus:
            log.warning(
                "backend=docker: %s asks for %g CPUs, the Docker engine has %d: "
                "the container is limited to %d",
                resources.source,
                resources.cpus,
                self.engine_cpus,
                self.engine_cpus,
            )
        self._ensure_image(image)
        if resources.gpus:
            self._check_gpus(image, resources, spec.instance_count)

    def _check_oss_input(self, channel: str, uri: str) -> None:
        transfer = self.oss  # no credentials: a UserError, before oss2 is even imported
        from oss2.exceptions import OssError

        try:
            found = transfer.exists_any(OssUri.parse(uri))
        except OssError as exc:
            raise UserError(
                f"job.inputs.{channel}: cannot read {uri} at {self.oss.endpoint} "
                f"({exc.code or exc.status}); check backend.oss and the credentials"
            ) from None
        if not found:
            raise UserError(f"job.inputs.{channel}: no object or prefix {uri} on OSS")

    def _resources(self, spec: JobSpec) -> Resources:
        return resolve(spec.instance_type, self.cpus, self.memory, self.gpus)

    def _image(self, spec: JobSpec) -> str:
        image = self.image or spec.image
        if not image:
            raise UserError(
                "job.image: backend=docker needs an image; set job.image, or backend.image "
                f"to run a local stand-in for it ({IMAGE_HINT})"
            )
        return image

    def _ensure_image(self, image: str) -> None:
        """The image is in the engine, or pulled now; else a one-line error naming it."""
        from docker.errors import DockerException, ImageNotFound

        key = "backend.image" if self.image else "job.image"
        try:
            self.client.api.inspect_image(image)
            return
        except ImageNotFound:
            pass
        log.warning("backend=docker: pulling image %s", image)
        try:
            self.client.images.pull(image)
        except (DockerException, OSError) as exc:
            raise UserError(
                f"{key}: image {image!r} is not in the local Docker engine and pulling it "
                f"failed ({_explain(exc)}); {IMAGE_HINT}"
            ) from None

    def _check_gpus(self, image: str, resources: Resources, count: int) -> None:
        """Start a throwaway container with the GPUs of the job's ``count`` instances: the
        engine must be able to give them all at once."""
        from docker.errors import APIError
        from docker.types import DeviceRequest

        api = self.client.api
        total = resources.gpus * count
        request = DeviceRequest(count=total, capabilities=[["gpu"]])
        probe = api.create_container(
            image,
            entrypoint=["/bin/sh", "-c", ":"],
            labels={ROOT_LABEL: str(self.root)},
            host_config=api.create_host_config(device_requests=[request]),
        )
        try:
            api.start(probe)
        except APIError as exc:
            if count > 1:
                raise UserError(
                    f"job.instance_count: {count} instances x {resources.gpus} GPU(s) of "
                    f"{resources.source} are {total} GPUs, more than the Docker engine can "
                    f"give ({_explain(exc)}); expected instances whose GPUs the engine has, "
                    "or backend.gpus=0 to run without"
                ) from None
            raise UserError(
                f"backend.gpus: {resources.source} asks for {resources.gpus} GPU(s) and the "
                f"Docker engine cannot give any ({_explain(exc)}); set backend.gpus=0 to run "
                "without"
            ) from None
        finally:
            self.remove_container(probe["Id"])

    def set_concurrency(self, jobs: int) -> None:
        """Concurrent containers share this machine: each job's OpenMP/BLAS threads are its
        instance type's vCPUs, at most an equal share of the engine's CPUs."""
        self.concurrency = max(1, jobs)

    # -- submit / find -----------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobHandle:
        job_dir = self.job_dir(spec.name)
        spec = self._with_local_inputs(spec)
        if not self.jobs.exists(spec.name):
            try:
                resources, image = self._resources(spec), self._image(spec)
            except UserError as exc:  # a swept value (instance type, image) it cannot run
                raise JobRejected(str(exc)) from None
            self.jobs.create(spec, lambda staging: self._add_files(spec, staging, resources, image))
        group = instances(job_dir, self.container_name(spec.name))
        if group:
            self._start_instances(spec, job_dir, group)
        else:
            self._start_once(spec, job_dir)
        return self._handle(spec.name)

    @property
    def oss(self) -> OssTransfer:
        """OSS access for ``oss://`` inputs, built on first use."""
        if self._oss is None:
            from paiexp.cloud.credentials import credential_client

            self._oss = OssTransfer(
                endpoint_url(self.oss_config.endpoint, self.oss_config.region),
                self.oss_config.region,
                credential_client(),
                cache_root() / "oss",
                RetryPolicy(),
            )
        return self._oss

    def _with_local_inputs(self, spec: JobSpec) -> JobSpec:
        """``oss://`` inputs as local copies (downloaded again only when they changed)."""
        remote = oss_channels(spec.inputs)
        if not remote:
            return spec
        cache = cache_root() / "oss-inputs"
        local = {c: str(self.oss.sync_down(OssUri.parse(u), cache)) for c, u in remote.items()}
        return dataclasses.replace(spec, inputs={**spec.inputs, **local})

    def find(self, name: str) -> JobHandle | None:
        return self._handle(name) if self.jobs.exists(name) else None

    def _start_once(self, spec: JobSpec, job_dir: Path) -> None:
        """Create the job's container unless it ever was, and start it unless it ran.

        A launcher that died between creating and starting leaves a created container:
        the next submit starts it. A container is never created twice: its name is taken
        (a racing launcher gets a conflict) and ``container`` records that it was created.
        """
        from docker.errors import APIError, NotFound

        api = self.client.api
        name = self.container_name(spec.name)
        try:
            status = api.inspect_container(name)["State"]["Status"]
        except NotFound:
            if (job_dir / CONTAINER_FILE).exists() or (job_dir / "state.json").exists():
                return  # created before, and collected (or lost) since
            if (job_dir / "stop").exists():
                self.record(job_dir, JobStatus(JobState.STOPPED, "stopped before it started"))
                return
            try:
                created = api.create_container(**self._container_options(spec, job_dir))
                (job_dir / CONTAINER_FILE).write_text(created["Id"])
                status = "created"
            except APIError as exc:
                if exc.status_code != 409:
                    raise
                status = api.inspect_container(name)["State"]["Status"]  # a racing launcher's
        if status != "created" or (job_dir / "stop").exists():
            return
        try:
            api.start(name)
        except APIError as exc:
            reason = f"the container did not start: {_explain(exc)}"
            self.record(job_dir, JobStatus(JobState.FAILED, reason))
            self.remove_container(name)

    def _start_instances(self, spec: JobSpec, job_dir: Path, group: list[Instance]) -> None:
        """Create the job's network and each instance's container unless it ever was, then
        start the created ones (the master first), unless the job was stopped or failed.
        As :meth:`_start_once`, per instance: a container is never created twice."""
        from docker.errors import APIError, NotFound

        api = self.client.api
        network = self.container_name(spec.name)
        if not api.networks(names=[network]):
            labels = {JOB_LABEL: spec.name, ROOT_LABEL: str(self.root)}
            api.create_network(network, driver="bridge", labels=labels, check_duplicate=True)
        shape = load_topology(job_dir)
        statuses = {}
        for instance in group:
            try:
                statuses[instance] = api.inspect_container(instance.container)["State"]["Status"]
            except NotFound:
                if (instance.directory / CONTAINER_FILE).exists() or ended(job_dir):
                    continue  # created before, and collected (or lost) since
                options = self._container_options(spec, job_dir, instance, shape)
                try:
                    created = api.create_container(**options)
                    (instance.directory / CONTAINER_FILE).write_text(created["Id"])
                    statuses[instance] = "created"
                except APIError as exc:
                    if exc.status_code != 409:
                        raise
                    statuses[instance] = "running"  # a racing launcher's: it starts it
        for instance, status in statuses.items():
            if status != "created" or ended(job_dir):
                continue
            try:
                api.start(instance.container)
            except APIError as exc:
                reason = f"{instance.name}: its container did not start: {_explain(exc)}"
                self.groups.fail(job_dir, instance, reason, None)
                return

    def _add_files(self, spec: JobSpec, job_dir: Path, resources: Resources, image: str) -> None:
        """The container's entry script, its log and its limits, beside the job's ``/ml``;
        a multi-instance job's other instances beside them."""
        working_dir = Path(contract.JobLayout(job_dir / "ml").working_dir)
        entry = entry_script(spec, working_dir, self.install_requirements, self.stop_grace_period)
        (job_dir / "paiexp").mkdir()
        (job_dir / "paiexp" / "job.log").touch()
        (job_dir / "paiexp" / "entry.sh").write_text(entry)
        if spec.instance_count > 1:
            shape = Topology(spec.instance_count, job_type(spec.job_type), resources.gpus)
            lay_out_instances(spec, shape, job_dir, entry)
        write_json_atomic(
            job_dir / "resources.json",
            {"image": image, "resources": dataclasses.asdict(resources)},
        )

    def _container_options(
        self,
        spec: JobSpec,
        job_dir: Path,
        instance: Instance | None = None,
        shape: Topology | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments of the engine's create call for the job's container, or for
        ``instance`` of a multi-instance job of ``shape``."""
        from docker.types import DeviceRequest, Mount

        api = self.client.api
        saved = read_json(job_dir / "resources.json")
        resources = Resources(**saved["resources"])
        layout = contract.JobLayout()
        own = instance.directory if instance else job_dir  # its own /ml and paiexp/
        host = contract.JobLayout(own / "ml")
        shared = contract.JobLayout(job_dir / "ml")  # the output channels: the job's
        mounts = [
            Mount(str(layout.working_dir), str(host.working_dir), type="bind"),
            Mount(str(layout.code_alias), str(host.working_dir), type="bind"),
            Mount(str(layout.config_dir), str(host.config_dir), type="bind"),
            Mount("/paiexp", str(own / "paiexp"), type="bind"),
        ]
        input_files: dict[str, str | None] = {}
        for channel, source in spec.inputs.items():
            target = layout.input_dir(channel)
            if Path(source).is_dir():
                input_files[channel] = None
            else:
                input_files[channel] = Path(source).name
                target = target / Path(source).name
            mounts.append(Mount(str(target), source, type="bind", read_only=True))
        for channel in spec.output_dirs:
            mounts.append(
                Mount(str(layout.output_dir(channel)), str(shared.output_dir(channel)), type="bind")
            )
        cpus = min(resources.cpus, self.engine_cpus) if resources.cpus else None
        share = cpu_share(self.engine_cpus, self.concurrency * spec.instance_count)
        threads = min(math.ceil(cpus), share) if cpus else share
        env = {"PYTHONUNBUFFERED": "1", **thread_environment(threads)}
        user = None if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        if user is not None:
            env["HOME"] = "/tmp"  # the image's HOME belongs to its root; pip needs a home
        env.update(spec.environments)
        env.update(
            contract.environment(layout, spec.hyperparameters, input_files, spec.output_dirs)
        )
        env.update(job_mlflow.environment(spec.environments, layout))
        env["TINI_KILL_PROCESS_GROUP"] = "1"  # a stop signals the job's whole process group
        labels = {**spec.labels, JOB_LABEL: spec.name, ROOT_LABEL: str(self.root)}
        name, network, networking = self.container_name(spec.name), self.network, None
        if instance is not None and shape is not None:
            env.update(shape.environment(instance.rank, addresses(shape)))
            labels[INSTANCE_LABEL] = instance.name
            name, network = instance.container, self.container_name(spec.name)
            endpoint = api.create_endpoint_config(aliases=[instance.name])
            networking = api.create_networking_config({network: endpoint})
        host_config = api.create_host_config(
            mounts=mounts,
            init=True,
            nano_cpus=int(cpus * 1e9) if cpus else None,
            mem_limit=resources.memory,
            memswap_limit=resources.memory,  # no swap beyond the limit: the limit bites
            device_requests=[DeviceRequest(count=resources.gpus, capabilities=[["gpu"]])]
            if resources.gpus
            else None,
            network_mode=network,
        )
        return {
            "image": saved["image"],
            "name": name,
            "hostname": instance.name if instance else None,
            "entrypoint": ["/bin/sh", "/paiexp/entry.sh"],
            "working_dir": str(layout.working_dir),
            "environment": env,
            "labels": labels,
            "user": user,
            "host_config": host_config,
            "networking_config": networking,
        }

    # -- status / logs / stop ----------------------------------------------------------------

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """Every job's status from one engine call (the containers of this backend's root)."""
        self._watch()
        self._changed.clear()
        listed: dict[str, list[dict[str, Any]]] = {}
        for summary in self.client.api.containers(
            all=True, filters={"label": f"{ROOT_LABEL}={self.root}"}
        ):
            listed.setdefault(summary["Labels"].get(JOB_LABEL), []).append(summary)
        return {
            handle.id: self._job_status(handle.name, listed.get(handle.name, []))
            for handle in handles
        }

    def _job_status(self, name: str, summaries: list[dict[str, Any]]) -> JobStatus:
        group = instances(self.job_dir(name), self.container_name(name))
        if group:
            return self.groups.status(name, group, summaries)
        return self._status(name, summaries[0] if summaries else None)

    def wait(self, handles: Sequence[JobHandle], timeout: float) -> None:
        """Sleep until one of this backend's containers dies (the engine's events) or timeout."""
        if self._watcher is not None and self._watcher.is_alive():
            self._changed.wait(timeout)
        else:
            time.sleep(timeout)

    def _watch(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(
                target=self._follow_events, name="paiexp-docker-events", daemon=True
            )
            self._watcher.start()

    def _follow_events(self) -> None:
        """Wake ``wait`` whenever a container of this root dies; ends if the engine goes."""
        try:
            events = connect().api.events(
                filters={"type": "container", "event": "die", "label": f"{ROOT_LABEL}={self.root}"},
                decode=True,
            )
            for event in events:
                self.died.add(event["Actor"]["Attributes"]["name"])
                self._changed.set()
        except Exception:  # the engine went away: wait() sleeps instead
            self._changed.set()

    def _status(self, name: str, summary: dict[str, Any] | None) -> JobStatus:
        job_dir = self.job_dir(name)
        final = read_json(job_dir / "state.json")
        if final is not None:
            if summary is not None and not self.keep_containers:
                self.remove_container(summary["Id"])  # a launcher died before removing it
            return JobStatus(**{**final, "state": JobState(final["state"])})
        if summary is None:
            if (job_dir / CONTAINER_FILE).exists():
                return JobStatus(
                    JobState.FAILED,
                    reason="the job's container was removed before its end was collected",
                    infrastructure=True,
                )
            if self.jobs.starting(name):
                return JobStatus(JobState.PENDING)
            return JobStatus(
                JobState.FAILED, reason="the job's container was never created", infrastructure=True
            )
        if summary["State"] == "created" and not (job_dir / "stop").exists():
            return JobStatus(JobState.PENDING)
        running = JobStatus(JobState.RUNNING, started_at=float(summary["Created"]))
        if summary["State"] in RUNNING_STATES and self.container_name(name) not in self.died:
            return running
        return self._collect(name, summary["Id"]) or running

    def _collect(self, name: str, container_id: str) -> JobStatus | None:
        """A container has ended: record its outcome, persist outputs, remove it.

        None if it still runs: the engine's list reports a container's death a moment after
        its events do.
        """
        job_dir = self.job_dir(name)
        state = self.client.api.inspect_container(container_id)["State"]
        if state["Status"] in RUNNING_STATES:
            return None
        spec = self.jobs.load_spec(name)
        resources = Resources(**read_json(job_dir / "resources.json")["resources"])
        end, reason = outcome(job_dir, state, resources)
        lost = end is JobState.FAILED and killed_from_outside(
            self.client, job_dir, container_id, state
        )
        if lost:
            reason = f"the job's container was killed from outside paiexp (preempted?); {reason}"
        layout = contract.JobLayout(job_dir / "ml")
        unpersisted = persist_outputs(spec.outputs, lambda c: Path(layout.output_dir(c)))
        if unpersisted and end is not JobState.STOPPED:
            end, reason = JobState.FAILED, f"{unpersisted}; {reason}" if reason else unpersisted
        status = JobStatus(
            end,
            reason or None,
            exit_code=state["ExitCode"],
            started_at=timestamp(state["StartedAt"]),
            ended_at=timestamp(state["FinishedAt"]),
            infrastructure=lost,
        )
        self.record(job_dir, status)
        self.died.discard(self.container_name(name))
        if not self.keep_containers:
            self.remove_container(container_id)
        return status

    def record(self, job_dir: Path, status: JobStatus) -> None:
        write_json_atomic(job_dir / "state.json", dataclasses.asdict(status))

    def remove_container(self, container: str) -> None:
        from docker.errors import APIError

        try:
            self.client.api.remove_container(container, v=True, force=True)
        except APIError as exc:  # another launcher removed it already
            if exc.status_code not in (404, 409):
                raise

    def remove_network(self, network: str) -> None:
        from docker.errors import APIError

        try:
            self.client.api.remove_network(network)
        except APIError as exc:  # another launcher removed it already
            if exc.status_code != 404:
                raise

    def read_logs(self, handle: JobHandle, cursor: int, *, final: bool = False) -> LogChunk:
        return read_log_file(self.job_dir(handle.name) / "paiexp" / "job.log", cursor, final)

    def instance_logs(self, handle: JobHandle) -> dict[str, Path]:
        group = instances(self.job_dir(handle.name), handle.id)
        return {instance.name: instance.directory / "paiexp" / "job.log" for instance in group}

    def label(self, handle: JobHandle, labels: Mapping[str, str]) -> None:
        """A container's labels are fixed when it is created: nothing to update."""

    def stop(self, handle: JobHandle) -> None:
        """``docker stop`` with the grace period, in the background: the caller's loop goes on
        and sees the job end STOPPED. A container not started yet never starts."""
        (self.job_dir(handle.name) / "stop").touch()
        group = instances(self.job_dir(handle.name), handle.id)
        self.groups.stop([instance.container for instance in group] or [handle.id])

    def stop_container(self, container: str) -> None:
        from docker.errors import APIError

        try:
            self.client.api.stop(container, timeout=math.ceil(self.stop_grace_period))
        except APIError as exc:  # gone already
            if exc.status_code != 404:
                raise


def connect() -> Any:
    """A client of the engine that ``DOCKER_HOST`` (or the default socket) names."""
    try:
        import docker
    except ImportError:
        raise UserError(PACKAGE_HINT) from None
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, OSError) as exc:
        where = os.environ.get("DOCKER_HOST")
        named = f"DOCKER_HOST={where}" if where else "unix:///var/run/docker.sock (no DOCKER_HOST)"
        raise UserError(
            f"backend=docker: no Docker engine answers at {named} ({_explain(exc)}); "
            "start it, or set DOCKER_HOST to one that runs"
        ) from None
    return client


def _explain(exc: BaseException) -> str:
    """The engine's own words for an error, on one line."""
    text = str(getattr(exc, "explanation", None) or exc).strip()
    return " ".join(text.split())[:300]
