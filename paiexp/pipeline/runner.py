"""Running a prepared pipeline: each step once the steps it depends on ended, independent
steps at the same time (each in a thread of its own, through the same backends and launcher
as a single run or sweep), decided in dependency order:

- a step after one that failed (or did not run) does not run (``not-run``);
- a step after one that was skipped, or whose ``when`` is false, is skipped (recorded in
  MLflow with the condition and the values it saw);
- a step that succeeded in an earlier launch is not run again; one a launcher left running
  is followed again; one that failed runs again, as a new attempt.

The first Ctrl-C stops the running steps' jobs and starts nothing new; a second leaves them
running (the same command follows them again) and exits at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from paiexp.errors import UserError
from paiexp.pipeline.condition import ConditionError
from paiexp.pipeline.execution import StepExecution, StepOutcome
from paiexp.pipeline.graph import Step
from paiexp.pipeline.job_step import JobStep
from paiexp.pipeline.naming import redacted
from paiexp.pipeline.prepare import PreparedPipeline
from paiexp.pipeline.state import StepRecord, StepStatus
from paiexp.pipeline.sweep_step import SweepStep
from paiexp.pipeline.tracking import PipelineRuns
from paiexp.runs import Echo
from paiexp.util.diskfull import DiskFull, disk_full

WAKE_SECONDS = 0.5  # how often the loop looks at an interrupt while steps run


@dataclass
class PipelineOutcome:
    statuses: dict[str, StepStatus]
    notes: dict[str, str]
    interrupted: bool

    @property
    def failed(self) -> bool:
        return any(not status.ok for status in self.statuses.values())


class PipelineRunner:
    def __init__(
        self, prepared: PreparedPipeline, runs: PipelineRuns, *, echo: Echo | None, say: Echo
    ) -> None:
        self.prepared = prepared
        self.graph = prepared.graph
        self.state = prepared.state
        self.runs = runs
        self.echo = echo
        self.say = say
        self.statuses: dict[str, StepStatus] = {}
        self.notes: dict[str, str] = {}
        self.results: dict[str, Any] = {}  # the results of the steps that succeeded
        self.running: dict[str, StepExecution] = {}
        self.ended: queue.Queue[tuple[str, StepOutcome]] = queue.Queue()
        self.interrupts = 0
        self.disk_full: DiskFull | None = None  # stopped a step: the pipeline stops, as if killed

    def run(self) -> PipelineOutcome:
        pending = list(self.graph.steps)
        stopped = False
        with self.interrupts_handled():
            while pending or self.running:
                if self.interrupts and not stopped:
                    stopped = True
                    for execution in self.running.values():
                        execution.stop()
                for name in list(pending):
                    step = self.graph.steps[name]
                    if any(d in pending or d in self.running for d in step.depends):
                        continue
                    pending.remove(name)
                    if self.interrupts:
                        self.end(name, StepStatus.not_run, note="the pipeline was interrupted")
                    else:
                        self.decide(step)
                if self.running:
                    try:
                        name, outcome = self.ended.get(timeout=WAKE_SECONDS)
                    except queue.Empty:
                        continue
                    if self.disk_full is not None:  # its step stays running, for the relaunch
                        raise self.disk_full
                    del self.running[name]
                    self.finished(name, outcome)
        return PipelineOutcome(self.statuses, self.notes, bool(self.interrupts))

    # -- deciding ---------------------------------------------------------------------------

    def decide(self, step: Step) -> None:
        """Start the step, or record why it does not run."""
        name = step.name
        record = self.state.steps.get(name)
        failed = [d for d in step.depends if not self.statuses[d].ok]
        if failed:
            self.end(name, StepStatus.not_run, note=f"{failed[0]} {self.statuses[failed[0]]}")
            return
        skipped = [d for d in step.depends if self.statuses[d] is StepStatus.skipped]
        if skipped:
            self.skip(step, f"{skipped[0]} was skipped", {})
            return
        if record is not None and record.status is StepStatus.succeeded:
            self.say(f"step {name}: succeeded before ({record.handle}); not run again")
            self.statuses[name] = StepStatus.succeeded
            self.results[name] = record.results
            return
        if step.when is not None:
            try:
                run, seen = step.when.evaluate(self.results)
            except ConditionError as exc:
                self.end(name, StepStatus.failed, note=f"when: {exc}")
                return
            if not run:
                self.skip(step, f"when: {step.when.text} is false", seen)
                return
        attempt = record.attempt if record is not None else 0
        if record is not None and record.status in (StepStatus.failed, StepStatus.stopped):
            attempt += 1  # a new job (or study); the one that failed stays as it ended
        try:
            prepared = self.prepared.preparer.prepare(step, self.results, attempt)
        except UserError as exc:
            self.end(name, StepStatus.failed, note=str(exc))
            return
        again = record is not None and record.status is StepStatus.running
        self.state.steps[name] = StepRecord(
            StepStatus.running,
            attempt,
            prepared.digest,
            redacted(prepared.data),
            prepared.handle,
        )
        self.state.save()  # before the job exists: a relaunch finds it by this name
        execution: StepExecution
        if prepared.sweep is not None:
            execution = SweepStep(name, prepared.sweep, self.runs, prepared.digest)
        else:
            assert prepared.job is not None
            echo = self.echo
            prefixed = (lambda line: echo(f"[{name}] {line}")) if echo is not None else None
            execution = JobStep(
                name, prepared.job, self.runs, prepared.digest, echo=prefixed, say=self.say
            )
        how = "following it again" if again else f"{prepared.step.kind} {prepared.handle}"
        self.say(f"step {name}: started ({how})")
        self.running[name] = execution
        threading.Thread(
            target=self._run_step, args=(name, execution), name=f"paiexp-step-{name}", daemon=True
        ).start()

    def _run_step(self, name: str, execution: StepExecution) -> None:
        try:
            outcome = execution.run()
        except UserError as exc:
            outcome = StepOutcome(StepStatus.failed, note=str(exc))
        except Exception as exc:
            self.disk_full = disk_full(exc)
            if self.disk_full is None:  # a bug: say it in full, and let the other steps go on
                traceback.print_exc()
            outcome = StepOutcome(StepStatus.failed, note=f"{type(exc).__name__}: {exc}")
        self.ended.put((name, outcome))

    def skip(self, step: Step, why: str, seen: dict[str, Any]) -> None:
        """Record the step skipped; a relaunch that skips it for the same reason adds no run."""
        name = step.name
        signature = hashlib.sha256(json.dumps([why, seen], default=str).encode()).hexdigest()
        record = self.state.steps.get(name)
        if (
            record is not None
            and record.status is StepStatus.skipped
            and record.digest == signature
        ):
            self.statuses[name] = StepStatus.skipped
            self.notes[name] = why
            return
        run_id = self.runs.skipped(name, why, seen)
        attempt = record.attempt if record is not None else 0
        self.state.steps[name] = StepRecord(
            StepStatus.skipped, attempt, signature, run_id=run_id, note=why, results={"seen": seen}
        )
        self.state.save()
        self.statuses[name] = StepStatus.skipped
        self.notes[name] = why
        self.say(f"step {name}: skipped ({why})")

    # -- ending -----------------------------------------------------------------------------

    def finished(self, name: str, outcome: StepOutcome) -> None:
        record = self.state.steps[name]
        record.status = outcome.status
        record.results = outcome.results or None
        record.run_id = outcome.run_id
        record.note = outcome.note
        self.state.save()
        self.runs.step_ended(outcome.run_id, outcome.status)
        self.statuses[name] = outcome.status
        if outcome.note:
            self.notes[name] = outcome.note
        if outcome.status is StepStatus.succeeded:
            self.results[name] = outcome.results
        self.say(f"step {name}: {outcome.status}" + (f" ({outcome.note})" if outcome.note else ""))

    def end(self, name: str, status: StepStatus, *, note: str) -> None:
        """A step that ends without running."""
        record = self.state.steps.get(name)
        if record is None or record.status is not StepStatus.succeeded:
            attempt = record.attempt if record is not None else 0
            self.state.steps[name] = StepRecord(status, attempt, note=note)
            self.state.save()
        self.statuses[name] = status
        self.notes[name] = note
        self.say(f"step {name}: {status} ({note})")

    @contextmanager
    def interrupts_handled(self) -> Iterator[None]:
        """Ctrl-C sets a flag the loop acts on; a second one leaves at once."""

        def on_interrupt(signum: int, frame: FrameType | None) -> None:
            self.interrupts += 1
            if self.interrupts == 1:
                self.say(
                    "interrupted: stopping the running steps, starting no more "
                    "(Ctrl-C again to leave them running)"
                )
                return
            self.say("left running; the same command follows them again")
            sys.stderr.flush()
            os._exit(130)  # the steps' threads hold jobs and launchers: no teardown

        previous: Callable[..., Any] | int | None = signal.signal(signal.SIGINT, on_interrupt)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
