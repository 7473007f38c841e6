"""The channel between a sweep's launcher and its tracking process: typed calls and replies.

The launcher sends one frozen message per call, numbered, in order; the tracking process
answers with the runs it created, the calls that failed, the calls done, notices for the user
and, last, that it closed.
Everything here is plain picklable data: the launcher never imports MLflow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paiexp.config.record import SourceInfo
from paiexp.config.spec import JobSpec
from paiexp.metrics.extraction import MetricPoint
from paiexp.tracking.cost import RunCost
from paiexp.tracking.monitor import JobResult
from paiexp.util.diskfull import DiskFull


@dataclass(frozen=True)
class Resumed:
    """What a tracking process that died had made, as the launcher heard it: the sweep's
    parent run (None: not opened yet) and the trials' runs by job name."""

    parent_run_id: str | None
    runs: dict[str, str]


@dataclass(frozen=True)
class TrackingSetup:
    """What the tracking process needs to know of the sweep."""

    tracker_uri: str | None
    experiment: str
    storage: str
    study_name: str
    backend: Any  # the backend's config, to read finished jobs when reconciling
    base_dir: Path
    overrides: tuple[str, ...]
    source: SourceInfo | None
    register: str | None = None  # sweep.register: the registered model of the best trial's
    objective: str | None = None  # the metric of its (first) objective
    outage_timeout: float = 600.0  # tracker.outage_timeout, in seconds
    storage_outage_timeout: float = 300.0  # sweep.storage_outage_timeout, in seconds
    heartbeat_grace: float = 60.0  # sweep.heartbeat_grace, in seconds
    launcher: str = ""  # the launcher's identity (its heartbeats'), as it names itself
    resumed: Resumed | None = None  # for a tracking process replacing one that died


@dataclass(frozen=True)
class TrialRecord:
    """What a trial's run records: its job and its resolved config."""

    spec: JobSpec
    data: dict[str, Any]


@dataclass(frozen=True)
class FinishedTrial:
    """A trial that had finished before this launch: reconciling checks its run is closed."""

    job_name: str
    number: int
    state: str  # the name of its Optuna TrialState
    reason: str | None
    record: TrialRecord
    tags: dict[str, str]
    cost: RunCost | None = None  # what its job cost, as the study recorded it


@dataclass(frozen=True)
class NewParentRun:
    """What a sweep's parent run is created with, when there is none yet."""

    run_name: str
    tags: dict[str, str]
    params: dict[str, str]


# -- calls ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenParent:
    """Find or create the sweep's parent run and mark it RUNNING again.  Only the ``leader``
    (the launcher that chose the sweep id) creates a new one at once; the others wait for it.
    ``known_run_id``: the study's record of its parent run, when the launcher started."""

    sweep_id: str
    known_run_id: str | None
    leader: bool
    new: NewParentRun
    invocation: dict[str, str]


@dataclass(frozen=True)
class Reconcile:
    """Give each trial that finished before this launch a closed run."""

    trials: tuple[FinishedTrial, ...]


@dataclass(frozen=True)
class StartChild:
    """Create a trial's run (reuse an adopted trial's) and log its record."""

    job_name: str
    record: TrialRecord
    tags: dict[str, str]
    adopted: bool
    shared: bool = False  # other launchers follow the study: one may adopt the trial


@dataclass(frozen=True)
class FinishChild:
    """Log what a trial's job left (``unlogged``: the points no :class:`LogPoints` carried)
    and close its run."""

    job_name: str
    result: JobResult
    unlogged: tuple[MetricPoint, ...]
    status: str
    reason: str | None
    tags: dict[str, str]


@dataclass(frozen=True)
class LogPoints:
    """Running trials' new metric points on their runs, by job name: what every trial in flight
    printed since the last such call (only trials whose run the tracking process has made)."""

    points: dict[str, tuple[MetricPoint, ...]]


@dataclass(frozen=True)
class StartAndFinishChild:
    """A trial's start and finish, joined by the tracking process when both wait in its queue
    (the job ended before its run was made): one run made whole, in fewer round trips."""

    start: StartChild
    finish: FinishChild


@dataclass(frozen=True)
class FailChild:
    """Close the run of a trial whose job never ran (or was lost)."""

    job_name: str
    reason: str


@dataclass(frozen=True)
class UpdateBest:
    """The study's best so far, on the parent run; the best trial's run tagged."""

    metrics: dict[str, float]
    step: int
    tags: dict[str, str]
    best_job: str | None


@dataclass(frozen=True)
class Drawn:
    """The study's trials table and plots as the launcher drew them while the tracking
    process caught up: (artifact dir, file) pairs, drawn when ``finished`` trials had ended."""

    files: tuple[tuple[str, Path], ...]
    finished: int


@dataclass(frozen=True)
class FinishParent:
    """The study's plots and trials table on the parent run; then close it.  When another
    launcher than ``launcher`` (its owner string) has a trial running as this call is applied,
    it is left to the last launcher: decided then, not when the call was sent, as another
    launcher's tracking process may lag behind its trials (None: close in any case).
    ``drawn``: the study's artifacts, drawn again here if trials ended since."""

    interrupted: bool
    launcher: str | None = None
    drawn: Drawn | None = None


@dataclass(frozen=True)
class Close:
    """The last message: the tracking process answers :class:`Closed` and exits."""


Call = (
    OpenParent
    | Reconcile
    | StartChild
    | FinishChild
    | LogPoints
    | StartAndFinishChild
    | FailChild
    | UpdateBest
    | FinishParent
)


@dataclass(frozen=True)
class Sent:
    """A call as the launcher sent it: numbered in the order sent, stamped with when (what
    it logs is stamped so, however often it is tried).  ``again``: sent once more, to a new
    tracking process after one died, which may have applied it in part.  ``joined``: the
    number of a trial's finish the tracking process joined to its start (``call`` is then a
    :class:`StartAndFinishChild`)."""

    number: int
    at: float
    call: Call
    again: bool = False
    joined: int | None = None

    @property
    def numbers(self) -> tuple[int, ...]:
        """The numbers of the calls this one carries out."""
        return (self.number,) if self.joined is None else (self.number, self.joined)


def call_name(call: Call) -> str:
    """The call's name in messages to the user: ``StartChild`` -> ``start_child``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(call).__name__).lower()


# -- replies --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCreated:
    """A trial's run exists: the launcher labels the trial's job with its id."""

    job_name: str
    run_id: str


@dataclass(frozen=True)
class ParentOpened:
    """The sweep's parent run is open."""

    run_id: str


@dataclass(frozen=True)
class CallFailed:
    """A call failed; ``fatal`` when nothing can be tracked any more (no parent run, a full
    disk: then ``disk_full`` says which, and the launcher stops)."""

    text: str
    fatal: bool
    disk_full: DiskFull | None = None


@dataclass(frozen=True)
class Done:
    """The calls ``numbers`` were carried out (or given up): none is sent again."""

    numbers: tuple[int, ...]


@dataclass(frozen=True)
class Notice:
    """Something the user should hear while the sweep runs (the tracking server went away,
    came back)."""

    text: str


@dataclass(frozen=True)
class BestRun:
    """The run of a sweep's best trial, and its model's URI (None: it left none)."""

    run_id: str
    model_uri: str | None


@dataclass(frozen=True)
class Closed:
    """Every call is done; ``uri`` is the tracking URI, None when MLflow never opened, and
    ``experiment_id`` the experiment the runs are in."""

    uri: str | None
    experiment_id: str | None = None
    registered: str | None = None  # sweep.register's outcome, e.g. "m version 3 (best)"
    best: BestRun | None = None  # as the parent run names it


Reply = RunCreated | ParentOpened | CallFailed | Done | Notice | Closed
