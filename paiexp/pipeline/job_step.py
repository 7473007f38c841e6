"""A job step: its job submitted once, or followed again where a launcher left it.

The job's name is fixed before anything exists (see :mod:`paiexp.pipeline.naming`) and the
run that tracks it is found by that name, so a relaunch never submits a job twice: it follows
the job if it runs, reads its outcome if it ended, and submits it only if it never was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from paiexp.backends import JobHandle, JobState
from paiexp.errors import UserError
from paiexp.monitor import JobMonitor, JobResult
from paiexp.pipeline.execution import StepOutcome
from paiexp.pipeline.state import StepStatus
from paiexp.record import make_record
from paiexp.runs import Echo, PreparedJob, follow
from paiexp.tracking import TERMINAL_RUN_STATUSES

if TYPE_CHECKING:
    from paiexp.tracking import MlflowTracker

STATUS = {
    JobState.SUCCEEDED: StepStatus.succeeded,
    JobState.STOPPED: StepStatus.stopped,
    JobState.FAILED: StepStatus.failed,
}


class JobStep:
    def __init__(
        self,
        name: str,
        job: PreparedJob,
        tracker: MlflowTracker,
        tags: Mapping[str, str],
        *,
        echo: Echo | None,
        say: Echo,
    ) -> None:
        self.name = name
        self.job = job
        self.tracker = tracker
        self.tags = dict(tags)
        self.echo = echo
        self.say = say
        self.handle: JobHandle | None = None
        self.stopping = False

    def run(self) -> StepOutcome:
        job, spec, backend = self.job, self.job.spec, self.job.backend
        tracked = self.tracker.find_run(spec.name)
        log_path = job.base_dir / ".paiexp" / "logs" / f"{spec.name}.log"
        if tracked is not None and tracked.status in TERMINAL_RUN_STATUSES:
            # it ended and its run was closed; the launcher that saw it died before saying so
            handle = backend.find(spec.name)
            if handle is None:
                return StepOutcome(StepStatus.failed, run_id=tracked.run_id, note="job is gone")
            monitor = JobMonitor(backend, handle, spec, log_path)
            status = backend.poll([handle])[handle.id]
            monitor.pull(final=True)
            return self.outcome(tracked.run_id, monitor.result(status))
        if tracked is None:
            record = make_record(job.data, spec, project_dir=job.base_dir, overrides=job.overrides)
            run_id = self.tracker.create_run(record, run_name=self.name, extra_tags=self.tags)
            self.tracker.log_record(run_id, record)
        else:
            run_id = tracked.run_id
        handle = backend.find(spec.name)
        logged = None
        if handle is None:
            labels = {**spec.labels, "paiexp-run": run_id}
            try:
                handle = backend.submit(dataclasses.replace(spec, labels=labels))
            except (UserError, OSError, RuntimeError) as exc:
                self.tracker.fail(run_id, f"submission failed: {exc}")
                return StepOutcome(StepStatus.failed, run_id=run_id, note=f"submission: {exc}")
            self.tracker.set_tags(
                run_id, {"paiexp.job_id": handle.id, "paiexp.status": "SUBMITTED"}
            )
            self.say(f"step {self.name}: job {spec.name} submitted to backend={backend.name}")
        else:  # a launcher that is gone submitted it: follow it on, metrics logged once
            names = [definition.name for definition in spec.metric_definitions]
            logged = self.tracker.logged_steps(run_id, names)
            self.say(f"step {self.name}: following job {spec.name} again")
        self.handle = handle
        if self.stopping:
            backend.stop(handle)
        result = follow(
            backend, handle, spec, self.tracker, run_id, job.base_dir, echo=self.echo, logged=logged
        )
        return self.outcome(run_id, result)

    def outcome(self, run_id: str, result: JobResult) -> StepOutcome:
        results: dict[str, Any] = {
            "status": STATUS[result.status.state].value,
            "job_name": result.handle.name,
            "run_id": run_id,
            "metrics": dict(result.metrics),
            "output_parameters": dict(result.output_parameters),
            "outputs": dict(result.outputs),
            "params": self.job.data["job"]["hyperparameters"],
        }
        return StepOutcome(STATUS[result.status.state], results, run_id, result.status.reason)

    def stop(self) -> None:
        self.stopping = True
        if self.handle is not None:
            self.job.backend.stop(self.handle)
