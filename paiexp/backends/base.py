"""The Backend protocol: the same verbs on every platform, so launchers never branch on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from paiexp.config.spec import JobSpec
from paiexp.errors import UserError


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


class BackendUnavailable(RuntimeError):
    """The platform did not answer (after retries); the jobs themselves may be fine."""


class SubmissionFailed(RuntimeError):
    """A job could not be handed to its backend (its files could not be written, say): its
    run is FAILED; the command line says why in one line, exit code 1."""


class JobRejected(UserError):
    """This one job cannot run here (a swept instance type or image the backend cannot use);
    other jobs of the same sweep may: its trial fails without a retry and the sweep goes on."""


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    reason: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    # Failed for a platform reason (lost, never started), not the script's: worth a retry.
    infrastructure: bool = False
    # Failed because the disk of the job's directory on this machine (this path) was full.
    full_disk: str | None = None

    @property
    def preempted(self) -> bool:
        """Taken away by the platform once it ran (a spot reclaim, a kill from outside, a
        lost node): a platform failure of a job that had started, not a full disk."""
        return (
            self.state is JobState.FAILED
            and self.infrastructure
            and self.started_at is not None
            and not self.full_disk
        )


@dataclass(frozen=True)
class JobHandle:
    """Enough to find a job again: its deterministic name and the platform's id for it."""

    name: str
    id: str


@dataclass(frozen=True)
class LogChunk:
    """Log lines, and the cursor to read on from: opaque to callers (a byte offset on local
    and docker, a line count on PAI), who only pass back a cursor they got (0 at first)."""

    lines: list[str]
    cursor: int


class Backend(Protocol):
    name: str
    poll_interval: float

    def validate(self, spec: JobSpec) -> None:
        """Raise UserError for anything this backend cannot run. Submits nothing."""

    def set_concurrency(self, jobs: int) -> None:
        """How many jobs the caller keeps running at once (a shared machine divides its CPUs)."""

    def submit(self, spec: JobSpec) -> JobHandle:
        """Start the job; idempotent by ``spec.name`` (an existing job is returned, not re-run)."""

    def find(self, name: str) -> JobHandle | None:
        """The job with this name, if it was ever submitted."""

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """Status of many jobs in one call, keyed by job id."""

    def wait(self, handles: Sequence[JobHandle], timeout: float) -> None:
        """Block until one of the jobs may have changed state, or ``timeout`` seconds."""

    def read_logs(self, handle: JobHandle, cursor: int, *, final: bool = False) -> LogChunk:
        """Complete log lines after ``cursor`` (0, or one a LogChunk of this job gave: what it
        counts is the backend's business); ``final`` also returns an unterminated tail."""

    def instance_logs(self, handle: JobHandle) -> dict[str, Path]:
        """A multi-instance job's log files here, by instance name (``master-0``,
        ``worker-0``, ...); {} for a job of one instance, whose log is :meth:`read_logs`'."""

    def label(self, handle: JobHandle, labels: Mapping[str, str]) -> None:
        """Add labels to a submitted job where the platform can (best effort, never raises)."""

    def stop(self, handle: JobHandle) -> None:
        """Ask the job to stop; it ends in state STOPPED."""

    def outputs(self, handle: JobHandle) -> dict[str, str]:
        """Output channel -> URI where the job's outputs are kept (``model`` among them)."""

    def output_parameters(self, handle: JobHandle) -> dict[str, float]:
        """Numbers the job wrote under ``output_parameters/``."""

    def output_is_empty(self, handle: JobHandle, channel: str) -> bool:
        """Whether the job left no file in this output channel (or has no such channel)."""

    def own_mlflow_store(self, handle: JobHandle, scratch: Path | None) -> Path | None:
        """The MLflow store the job's own calls made in its outputs
        (:mod:`paiexp.contract.job_mlflow`)
        as a directory here: where it is, on this machine, else a copy made in ``scratch``
        (none without one: a job's store is copied once it ended); None when it made none."""

    def service_metrics(self, handle: JobHandle) -> dict[str, float]:
        """Final metric values as the platform itself extracted them ({} if it does not)."""

    def tensorboard_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        """A directory here holding the job's ``tensorboard`` channel as it is now (a remote
        channel's new bytes fetched first; ``final``: however recently it was fetched), or None
        while there is none."""

    def own_mlflow_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        """The MLflow store the job's own calls make (:mod:`paiexp.contract.job_mlflow`) as a
        directory
        here, as it is now (a remote one's new bytes fetched first, as :meth:`tensorboard_dir`
        does), or None while there is none."""

    def console_url(self, handle: JobHandle) -> str | None:
        """Where a person can watch the job, if the platform has such a page."""
