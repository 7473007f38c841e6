"""How the PAI emulator runs a job's command: in a Docker container as PAI does, or on the host.

A container runs the local image that the job's PAI image URI maps to (``local_images``: an
image URI, or ``default`` for any, -> a tag in the local engine; nothing is ever pulled). The
job's ``ml`` directory is bind-mounted at ``/ml`` and its entry script's directory at
``/pai-emulator`` (outside ``/ml``: the job's tree is PAI's alone). Docker's init is PID 1 and
hands a stop to the job's whole process group. Every container carries the label
``paiexp-emulator.root=<the emulator's root>`` and is removed once its job has ended; the
emulator's shutdown removes any left.

A host process (the fast mode, without Docker) runs in its own process group, which a stop
kills: TERM, then KILL after the grace period.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ROOT_LABEL = "paiexp-emulator.root"
JOB_LABEL = "paiexp-emulator.job"
RUNTIME_DIR = "/pai-emulator"  # where a container finds its entry script


@dataclass(frozen=True)
class Instance:
    """Where one instance of a multi-instance job runs: its host name on the job's network,
    and the job's output directory that every instance shares."""

    host: str
    network: str
    output: Path


class Running(Protocol):
    """A job's command once started: its output lines, its exit code, a way to stop it."""

    def lines(self) -> Iterator[str]: ...

    def wait(self) -> int: ...

    def kill(self) -> None: ...

    def close(self) -> None: ...


class HostProcess:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, grace: float) -> None:
        self.grace = grace
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def lines(self) -> Iterator[str]:
        assert self.process.stdout is not None
        for raw in iter(self.process.stdout.readline, b""):
            yield _text(raw.rstrip(b"\n"))
        self.process.stdout.close()

    def wait(self) -> int:
        return self.process.wait()

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(self.grace)
        with contextlib.suppress(ProcessLookupError):  # what is left of the group
            os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        """Nothing to release: the process has been waited for."""


class JobContainer:
    def __init__(self, api: Any, container_id: str, grace: float) -> None:
        self.api, self.id, self.grace = api, container_id, grace

    def lines(self) -> Iterator[str]:
        """The container's output as it comes, line by line, an unterminated tail last (the
        engine's stream drops that tail when the container exits: it is read once more)."""
        pending, streamed = b"", 0
        for chunk in self.api.logs(self.id, stream=True, follow=True):
            streamed += len(chunk)
            *complete, pending = (pending + chunk).split(b"\n")
            yield from map(_text, complete)
        self.api.wait(self.id)
        *complete, pending = (pending + self.api.logs(self.id)[streamed:]).split(b"\n")
        yield from map(_text, complete)
        if pending:
            yield _text(pending)

    def wait(self) -> int:
        return int(self.api.wait(self.id)["StatusCode"])

    def kill(self) -> None:
        """``docker stop``: TERM to the job's process group, KILL after the grace period."""
        from docker.errors import APIError

        with contextlib.suppress(APIError):  # ended and removed already
            self.api.stop(self.id, timeout=math.ceil(self.grace))

    def close(self) -> None:
        from docker.errors import APIError

        with contextlib.suppress(APIError):
            self.api.remove_container(self.id, v=True, force=True)


class InstanceGroup:
    """The containers of a multi-instance job: a stop stops them all (each in its thread,
    within the grace period)."""

    def __init__(self) -> None:
        self.members: list[JobContainer] = []
        self.lock = threading.Lock()
        self.killed = False

    def add(self, container: JobContainer) -> None:
        with self.lock:
            self.members.append(container)
            killed = self.killed
        if killed:  # stopped while it was starting
            container.kill()

    def kill(self) -> None:
        with self.lock:
            self.killed, members = True, list(self.members)
        for container in members:
            threading.Thread(target=container.kill, daemon=True).start()

    def close(self) -> None:
        for container in self.members:
            container.close()


class ContainerEngine:
    """The local Docker engine, the images PAI image URIs map to, this emulator's containers."""

    def __init__(self, images: Mapping[str, str], root: Path, grace: float) -> None:
        import docker

        self.images = dict(images)
        self.root = str(root)
        self.grace = grace
        self.api = docker.from_env().api
        for tag in sorted(set(self.images.values())):
            try:
                self.api.inspect_image(tag)
            except docker.errors.ImageNotFound:
                raise RuntimeError(
                    f"PAI emulator: local image {tag} is not in the Docker engine "
                    "(bash tests/images/build.sh builds the test image)"
                ) from None

    def image_for(self, uri: str) -> str | None:
        """The local image a job with PAI image ``uri`` runs in (None: no image maps to it)."""
        return self.images.get(uri) or self.images.get("default")

    def start(
        self,
        job_id: str,
        image: str,
        ml: Path,
        runtime: Path,
        env: dict[str, str],
        instance: Instance | None = None,
    ) -> JobContainer:
        """Create and start the job's container running ``runtime/entry.sh`` (one
        ``instance`` of a multi-instance job: on its network, under its host name)."""
        from docker.types import Mount

        user = None if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        environment = {**env, "TINI_KILL_PROCESS_GROUP": "1"}
        if user is not None:
            environment.setdefault("HOME", "/tmp")  # the image's HOME is its root's
        mounts = [Mount("/ml", str(ml), type="bind"), Mount(RUNTIME_DIR, str(runtime), type="bind")]
        networking, network = None, None
        if instance is not None:  # the job's output channels, shared by its instances
            mounts.append(Mount("/ml/output", str(instance.output), type="bind"))
            network = instance.network
            endpoint = self.api.create_endpoint_config(aliases=[instance.host])
            networking = self.api.create_networking_config({network: endpoint})
        created = self.api.create_container(
            image,
            hostname=instance.host if instance else None,
            networking_config=networking,
            entrypoint=["/bin/sh", f"{RUNTIME_DIR}/entry.sh"],
            working_dir="/ml/usercode",
            environment=environment,
            labels={ROOT_LABEL: self.root, JOB_LABEL: job_id},
            user=user,
            host_config=self.api.create_host_config(mounts=mounts, init=True, network_mode=network),
        )
        container = JobContainer(self.api, created["Id"], self.grace)
        try:
            self.api.start(container.id)
        except Exception:
            container.close()
            raise
        return container

    def create_network(self, job_id: str) -> str:
        """A network for a multi-instance job's containers to reach each other by name."""
        name = f"pai-emulator-{job_id}"
        self.api.create_network(name, driver="bridge", labels={ROOT_LABEL: self.root})
        return name

    def remove_network(self, name: str) -> None:
        from docker.errors import APIError

        with contextlib.suppress(APIError):
            self.api.remove_network(name)

    def containers(self) -> list[dict[str, Any]]:
        """This emulator's containers still in the engine (running or not)."""
        return list(self.api.containers(all=True, filters={"label": f"{ROOT_LABEL}={self.root}"}))

    def remove_all(self) -> None:
        for summary in self.containers():
            JobContainer(self.api, summary["Id"], self.grace).close()
        for network in self.api.networks(filters={"label": f"{ROOT_LABEL}={self.root}"}):
            self.remove_network(network["Id"])


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace").rstrip("\r")


def entry_script(requirements: list[str], requirements_file: bool, command: list[str]) -> str:
    """A container's entry: install the requirements as PAI does (pip, ``requirements.txt``
    included; on failure pip's exit code goes to ``requirements-failed``), then the command."""
    lines = ["#!/bin/sh", "cd /ml/usercode || exit 1"]
    if requirements or requirements_file:
        shown = list(requirements)
        if requirements_file:
            shown.append("-r requirements.txt")
        args = [*requirements, *(["-r", "requirements.txt"] if requirements_file else [])]
        lines += [
            "echo " + shlex.quote("Installing Python requirements: " + ", ".join(shown)),
            "python=$(command -v python || command -v python3)",
            'PIP_BREAK_SYSTEM_PACKAGES=1 "$python" -m pip install --disable-pip-version-check '
            f"{shlex.join(args)} || {{ echo $? >{RUNTIME_DIR}/requirements-failed; exit 1; }}",
        ]
    lines.append(f"exec /bin/sh -c {shlex.quote(shlex.join(command))}")
    return "\n".join(lines) + "\n"
