"""The status of a multi-instance docker job: one job, whatever its containers.

The job runs while any of its instances does. The first instance to fail fails the job: its
reason (naming the instance) goes to ``<job>/failed`` (the first one written wins, across
launchers) and the other instances are stopped (``docker stop`` with the grace period). A
stop stops them all. Once every instance has ended, the job's outcome is recorded as a
one-instance job's is, its outputs persisted, and its containers and network removed; a
launcher that died before the removal has the next poll finish it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from paiexp.backends.base import JobState, JobStatus
from paiexp.backends.docker_instances import CONTAINER_FILE, Instance
from paiexp.backends.docker_outcome import killed_from_outside, outcome, timestamp
from paiexp.backends.instance_types import Resources
from paiexp.backends.jobdir import JobDirectories
from paiexp.backends.local_group import last_line
from paiexp.contract import layout as contract
from paiexp.util.confine import persist_outputs
from paiexp.util.jsonfiles import read_json

FAILED_FILE = "failed"
NETWORK_GONE = "network-removed"
TIMED_OUT = "exceeded max_run_time"  # the job's limit: its reason names no instance


class GroupsBackend(Protocol):
    """What the multi-instance jobs need of their docker backend (``DockerBackend``)."""

    jobs: JobDirectories
    died: set[str]  # containers it saw die
    keep_containers: bool

    @property
    def client(self) -> Any:  # docker.DockerClient
        ...

    def job_dir(self, name: str) -> Path: ...

    def container_name(self, name: str) -> str: ...

    def record(self, job_dir: Path, status: JobStatus) -> None: ...

    def stop_container(self, container: str) -> None: ...

    def remove_container(self, container: str) -> None: ...

    def remove_network(self, network: str) -> None: ...


class InstanceGroups:
    """The multi-instance jobs of a docker backend (see the module's docstring)."""

    def __init__(self, backend: GroupsBackend) -> None:
        self.backend = backend
        self._stopping: dict[str, threading.Thread] = {}  # container -> its docker stop

    def status(
        self, name: str, group: list[Instance], summaries: list[dict[str, Any]]
    ) -> JobStatus:
        """The job's status from its containers' summaries (one engine list for all jobs)."""
        job_dir = self.backend.job_dir(name)
        final = read_json(job_dir / "state.json")
        if final is not None:
            self.remove(name, summaries)  # what a launcher that died there left
            return JobStatus(**{**final, "state": JobState(final["state"])})
        listed = {summary["Names"][0].lstrip("/"): summary for summary in summaries}
        ending = ended(job_dir)
        finished: dict[Instance, dict[str, Any] | None] = {}  # None: never created
        running: list[str] = []
        for instance in group:
            summary = listed.get(instance.container)
            if summary is None:
                if (instance.directory / CONTAINER_FILE).exists():
                    reason = f"{instance.name}: its container was removed before its end"
                    self.fail(job_dir, instance, reason, None)
                    ending = True
                    finished[instance] = None
                elif ending:
                    finished[instance] = None
                elif self.backend.jobs.starting(name):
                    return JobStatus(JobState.PENDING)
                else:
                    reason = f"{instance.name}: its container was never created"
                    return JobStatus(JobState.FAILED, reason, infrastructure=True)
                continue
            state = self.final_state(instance, summary, ending)
            if state is None:
                running.append(instance.container)
            else:
                finished[instance] = state
        if not ending:
            ending = self.first_failure(job_dir, name, finished)
        if ending:
            self.stop(running)
        if len(finished) == len(group):
            return self.collect(name, finished, summaries)
        if all(summary["State"] == "created" for summary in summaries) and not ending:
            return JobStatus(JobState.PENDING)
        started = min(float(summary["Created"]) for summary in summaries)
        return JobStatus(JobState.RUNNING, started_at=started)

    def final_state(
        self, instance: Instance, summary: dict[str, Any], ending: bool
    ) -> dict[str, Any] | None:
        """The container's final state once it has ended (None: it runs, or will). The
        engine's list reports a death a moment after its events: those ask the engine."""
        if summary["State"] == "created" and not ending:
            return None
        died = instance.container in self.backend.died
        if summary["State"] in ("running", "paused", "restarting", "removing") and not died:
            return None
        state: dict[str, Any] = self.backend.client.api.inspect_container(summary["Id"])["State"]
        return None if state["Status"] in ("running", "paused", "restarting") else state

    def first_failure(
        self, job_dir: Path, name: str, finished: dict[Instance, dict[str, Any] | None]
    ) -> bool:
        """Fail the job by the first of its ended instances that failed, if one did."""
        resources = Resources(**read_json(job_dir / "resources.json")["resources"])
        failures = [
            (state["FinishedAt"], instance, state)
            for instance, state in finished.items()
            if state is not None
            and outcome(instance.directory, state, resources)[0] is JobState.FAILED
        ]
        if not failures:
            return False
        _, instance, state = min(failures, key=lambda failure: failure[0])
        _, reason = outcome(instance.directory, state, resources)
        if not reason.startswith(TIMED_OUT):
            reason = f"{instance.name} {reason.removeprefix('command ')}"
            if not (instance.directory / "paiexp" / "failure").exists():
                last = last_line(str(instance.directory / "paiexp" / "job.log"))
                reason += f": {last}" if last else ""
        client = self.backend.client
        lost = killed_from_outside(client, instance.directory, instance.container, state)
        if lost:  # a platform failure, not the script's: worth a retry
            reason = f"{reason} (its container was killed from outside paiexp: preempted?)"
        self.fail(job_dir, instance, reason, int(state["ExitCode"]), lost=lost)
        return True

    def fail(
        self,
        job_dir: Path,
        instance: Instance,
        reason: str,
        exit_code: int | None,
        *,
        lost: bool = False,
    ) -> None:
        """Record the job's failure by ``instance`` unless one was recorded first; ``lost``:
        the platform took the instance away (not the script's failure)."""
        try:
            descriptor = os.open(job_dir / FAILED_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return
        with os.fdopen(descriptor, "w") as stream:
            json.dump({"reason": reason, "exit_code": exit_code, "lost": lost}, stream)

    def stop(self, containers: list[str]) -> None:
        """``docker stop`` each container, in the background, unless it is being stopped."""
        for container in containers:
            current = self._stopping.get(container)
            if current is not None and current.is_alive():
                continue
            thread = threading.Thread(target=self.backend.stop_container, args=(container,))
            thread.daemon = True
            self._stopping[container] = thread
            thread.start()

    def collect(
        self,
        name: str,
        finished: dict[Instance, dict[str, Any] | None],
        summaries: list[dict[str, Any]],
    ) -> JobStatus:
        """Every instance has ended: record the job's outcome, persist its outputs, remove
        its containers and network."""
        backend = self.backend
        job_dir = backend.job_dir(name)
        states = [state for state in finished.values() if state is not None]
        started = [t for t in (timestamp(s["StartedAt"]) for s in states) if t is not None]
        failure = read_json(job_dir / FAILED_FILE)
        exit_code, lost = None, False
        if (job_dir / "stop").exists():
            end, reason = JobState.STOPPED, "stopped" if started else "stopped before it started"
        elif failure is not None:
            end, reason, exit_code = JobState.FAILED, failure["reason"], failure["exit_code"]
            lost = bool(failure.get("lost"))
        else:
            end, reason, exit_code = JobState.SUCCEEDED, "", 0
        spec = backend.jobs.load_spec(name)
        layout = contract.JobLayout(job_dir / "ml")
        unpersisted = persist_outputs(spec.outputs, lambda c: Path(layout.output_dir(c)))
        if unpersisted and end is not JobState.STOPPED:
            end, reason = JobState.FAILED, f"{unpersisted}; {reason}" if reason else unpersisted
        ended_at = [t for t in (timestamp(s["FinishedAt"]) for s in states) if t is not None]
        status = JobStatus(
            end,
            reason or None,
            exit_code=exit_code,
            started_at=min(started) if started else None,
            ended_at=max(ended_at) if ended_at else None,
            infrastructure=lost,
        )
        backend.record(job_dir, status)
        self.remove(name, summaries)
        return status

    def remove(self, name: str, summaries: list[dict[str, Any]]) -> None:
        """Remove the job's containers, then its network (once)."""
        backend = self.backend
        if backend.keep_containers:
            return
        for summary in summaries:
            backend.died.discard(summary["Names"][0].lstrip("/"))
            backend.remove_container(summary["Id"])
        marker = backend.job_dir(name) / NETWORK_GONE
        if marker.exists():
            return
        for network in backend.client.api.networks(names=[backend.container_name(name)]):
            backend.remove_network(network["Id"])
        marker.touch()


def ended(job_dir: Path) -> bool:
    """Whether the job is ending: a stop was asked, or an instance failed it."""
    return (job_dir / "stop").exists() or (job_dir / FAILED_FILE).exists()
