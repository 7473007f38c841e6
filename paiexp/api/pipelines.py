"""The Python API's pipelines: launched as ``python -m paiexp +pipeline=NAME`` launches them
(after the same checks, a detached process of its own), or attached by name; each step's
status and results as the pipeline's state file records them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paiexp.api.jobs import compose_project, user_errors
from paiexp.api.launch import launch_detached
from paiexp.errors import UserError

if TYPE_CHECKING:
    from paiexp.pipeline.prepare import PreparedPipeline
    from paiexp.pipeline.runner import PipelineOutcome

POLL_SECONDS = 1.0  # how often wait() looks at a pipeline another process runs


@dataclass
class Pipeline:
    """A pipeline's steps as its state file holds them; its launcher, when started here."""

    name: str
    base_dir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log_path: Path | None = None

    def steps(self) -> dict[str, str]:
        """Each step's status: pending, running, succeeded, failed, stopped, skipped, not-run
        (a step not yet reached is pending)."""
        state = self._state()
        return {name: record.status.value for name, record in state.steps.items()}

    def results(self, step: str) -> dict[str, Any]:
        """What a step that ran left: status, job_name or study_name, run_id, metrics,
        outputs, params, best (a sweep step's), as a later step's references see them."""
        record = self._state().steps.get(step)
        if record is None or record.results is None:
            raise UserError(f"results: step {step!r} of pipeline {self.name} has no results")
        return dict(record.results)

    @property
    def running(self) -> bool:
        """Whether a launcher holds the pipeline (here or in another process)."""
        if self.process is not None and self.process.poll() is None:
            return True
        lock = self._state().path.with_suffix(".lock")
        if not lock.exists():
            return False
        with lock.open("a") as stream:
            try:
                fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(stream, fcntl.LOCK_UN)
        return False

    def wait(self, timeout: float | None = None) -> Pipeline:
        """Until its launcher ended; TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.running:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"pipeline {self.name} still running")
            if self.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(POLL_SECONDS)
            else:
                time.sleep(POLL_SECONDS)
        return self

    def stop(self) -> None:
        """As Ctrl-C in the launcher's terminal: its running steps' jobs stopped, nothing new
        started (the launcher this process started)."""
        if self.process is None or self.process.poll() is not None:
            raise UserError(f"stop: no launcher of pipeline {self.name} started here runs")
        os.kill(self.process.pid, signal.SIGINT)

    def log(self) -> str:
        """What the launcher started here printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def _state(self) -> Any:
        from paiexp.pipeline.state import PipelineState

        return PipelineState.load(self.base_dir, self.name)


@user_errors
def start_pipeline(
    *overrides: str,
    project: str | os.PathLike[str] = ".",
    config_dirs: Sequence[str | os.PathLike[str]] = (),
    wait: bool = False,
) -> Pipeline:
    """Launch a pipeline (``'+pipeline=NAME'`` and any overrides) as the command line does,
    after every check it makes (a mistake raises before anything starts)."""
    base_dir = Path(project).absolute()
    dirs = tuple(str(Path(d).absolute()) for d in config_dirs)
    composed = compose_project(overrides, base_dir, dirs)
    if composed.kind != "pipeline":
        raise UserError(f"pipeline: the config is a {composed.kind}; select one with +pipeline=")
    name = composed.prepared_pipeline().graph.name
    process, log_path = launch_detached(tuple(overrides), base_dir, dirs, f"pipeline-{name}")
    handle = Pipeline(name, base_dir, process, log_path)
    if wait:
        handle.wait()
    return handle


def run_prepared_pipeline(
    prepared: PreparedPipeline,
    rerun: Sequence[str] = (),
    *,
    echo: Callable[[str], None] | None = None,
) -> tuple[PipelineOutcome, str]:
    """Run a checked pipeline in this process (the command line's launcher, and so each one
    :func:`start_pipeline` detaches): its state locked, picked up where the launcher before
    left it (``rerun``: these steps and the ones after them again), its runs closed.  Gives
    the outcome and the tracking URI.  ``echo``: each line of the steps' job logs."""
    from paiexp.pipeline.resume import check_state, start_again
    from paiexp.pipeline.runner import PipelineRunner
    from paiexp.pipeline.tracking import PipelineRuns
    from paiexp.util.terminal import say

    check_state(prepared, rerun)
    prepared.state.lock()
    prepared.state.reload()  # as the launcher before this one left it
    start_again(prepared, check_state(prepared, rerun))
    prepared.state.save()

    runs = PipelineRuns(prepared.tracker, prepared)  # MLflow opens when first needed
    outcome = PipelineRunner(prepared, runs, echo=echo, say=say).run()
    runs.close(outcome.statuses, interrupted=outcome.interrupted)
    return outcome, runs.uri


@user_errors
def attach_pipeline(name: str, *, project: str | os.PathLike[str] = ".") -> Pipeline:
    """A pipeline started anywhere in the project, by its name."""
    handle = Pipeline(name, Path(project).absolute())
    if not handle._state().path.exists():
        raise UserError(f"attach_pipeline: the project has no pipeline {name!r} that ran")
    return handle
