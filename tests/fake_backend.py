"""An in-memory Backend whose jobs follow scripts: no processes, no sleeps.

Each job's script (chosen per job, e.g. by its hyperparameters) lists the log lines it prints,
one per step, and how it ends.  Time is steps: every ``wait`` moves every live job one step
on (a line printed, or its end once all are), so a launcher's loop drives its jobs exactly as
far as it waits for them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from paiexp.backends import JobHandle, JobRejected, JobState, JobStatus, LogChunk
from paiexp.config.spec import JobSpec
from paiexp.errors import UserError


@dataclass(frozen=True)
class Script:
    """How one job goes: ``lines`` printed one per step, then it ends in ``state``."""

    lines: tuple[str, ...] = ()
    state: JobState = JobState.SUCCEEDED
    reason: str | None = None
    infrastructure: bool = False  # failed for the platform's reason, not the script's
    rejected: str | None = None  # ``submit`` raises JobRejected: this job cannot run here
    refused: str | None = None  # ``submit`` raises UserError: no job of the sweep can


@dataclass
class FakeJob:
    handle: JobHandle
    spec: JobSpec
    script: Script
    created_at: int  # the backend's step of time when it was created
    ended_at: int | None = None
    printed: int = 0
    state: JobState = JobState.RUNNING
    stopping: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    def step(self, now: int) -> None:
        """Print the next line, or end (stopped, or as scripted once all lines are out)."""
        if self.stopping:
            self.state = JobState.STOPPED
        elif self.printed < len(self.script.lines):
            self.printed += 1
        else:
            self.state = self.script.state
        if self.state.terminal:
            self.ended_at = now

    def status(self) -> JobStatus:
        ended = self.state.terminal and self.state is not JobState.SUCCEEDED
        by_script = ended and not self.stopping
        return JobStatus(
            self.state,
            reason=self.script.reason if by_script else ("stopped" if ended else None),
            infrastructure=self.script.infrastructure if by_script else False,
        )


class FakeBackend:
    name = "fake"
    poll_interval = 1.0

    def __init__(
        self,
        script: Callable[[JobSpec], Script],
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        """``on_step(n)`` is called after the n-th step of time (from 1)."""
        self.script = script
        self.on_step = on_step
        self.jobs: dict[str, FakeJob] = {}  # by name
        self.created: list[str] = []  # job names, in the order the jobs were created
        self.stopped: list[str] = []
        self.concurrency: int | None = None
        self.steps = 0
        self.most_running = 0  # the most jobs ever running at once

    def validate(self, spec: JobSpec) -> None:
        pass

    def set_concurrency(self, jobs: int) -> None:
        self.concurrency = jobs

    def submit(self, spec: JobSpec) -> JobHandle:
        if spec.name in self.jobs:
            return self.jobs[spec.name].handle
        script = self.script(spec)
        if script.rejected is not None:
            raise JobRejected(script.rejected)
        if script.refused is not None:
            raise UserError(script.refused)
        job = FakeJob(JobHandle(spec.name, f"id-{spec.name}"), spec, script, self.steps)
        self.jobs[spec.name] = job
        self.created.append(spec.name)
        self.most_running = max(self.most_running, len(self.running()))
        return job.handle

    def find(self, name: str) -> JobHandle | None:
        job = self.jobs.get(name)
        return job.handle if job else None

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        return {h.id: self.jobs[h.name].status() for h in handles}

    def wait(self, handles: Sequence[JobHandle], timeout: float) -> None:
        self.steps += 1
        for job in self.running():
            job.step(self.steps)
        if self.on_step is not None:
            self.on_step(self.steps)

    def read_logs(self, handle: JobHandle, cursor: int, *, final: bool = False) -> LogChunk:
        job = self.jobs[handle.name]
        return LogChunk(list(job.script.lines[cursor : job.printed]), job.printed)

    def label(self, handle: JobHandle, labels: Mapping[str, str]) -> None:
        self.jobs[handle.name].labels.update(labels)

    def stop(self, handle: JobHandle) -> None:
        self.stopped.append(handle.name)
        self.jobs[handle.name].stopping = True

    def outputs(self, handle: JobHandle) -> dict[str, str]:
        return {}

    def output_parameters(self, handle: JobHandle) -> dict[str, float]:
        return {}

    def output_is_empty(self, handle: JobHandle, channel: str) -> bool:
        return True  # a fake job writes no files

    def own_mlflow_store(self, handle: JobHandle, scratch: Path | None) -> Path | None:
        return None

    def service_metrics(self, handle: JobHandle) -> dict[str, float]:
        return {}

    def tensorboard_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        return None  # a fake job writes no event files

    def own_mlflow_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        return None  # nor makes MLflow calls

    def console_url(self, handle: JobHandle) -> str | None:
        return None

    def instance_logs(self, handle: JobHandle) -> dict[str, Path]:
        return {}

    def running(self) -> list[FakeJob]:
        return [job for job in self.jobs.values() if not job.state.terminal]

    def lose(self, name: str) -> None:
        """The platform forgets the job, as if it had never been."""
        del self.jobs[name]
