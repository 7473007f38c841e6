"""A job step: its job submitted once, or followed again where a launcher left it.

The job's name is fixed before anything exists (see :mod:`paiexp.pipeline.naming`), so a
relaunch never submits a job twice: it follows the job if it runs, reads its outcome if it
ended (and its run was closed), and submits it only if it never was.  The job is submitted
before its run is made (the run found again by the job's name, the job labelled with it
after): MLflow's start-up takes place while the job runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paiexp.backends import JobHandle, JobState
from paiexp.config.record import make_record
from paiexp.errors import UserError
from paiexp.pipeline.execution import StepOutcome
from paiexp.pipeline.state import StepStatus
from paiexp.runs import Echo, PreparedJob, follow
from paiexp.tracking.cost import prices_of
from paiexp.tracking.mlflow_tracker import TERMINAL_RUN_STATUSES
from paiexp.tracking.monitor import JobMonitor, JobResult, job_log
from paiexp.util.diskfull import disk_full

if TYPE_CHECKING:
    from paiexp.pipeline.tracking import PipelineRuns
    from paiexp.tracking.mlflow_tracker import MlflowTracker

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
        runs: PipelineRuns,
        digest: str,
        *,
        echo: Echo | None,
        say: Echo,
    ) -> None:
        self.name = name
        self.job = job
        self.runs = runs
        self.digest = digest
        self.echo = echo
        self.say = say
        self.handle: JobHandle | None = None
        self.stopping = False

    def run(self) -> StepOutcome:
        job, spec, backend = self.job, self.job.spec, self.job.backend
        handle = backend.find(spec.name)
        if handle is None:
            try:
                handle = backend.submit(spec)
            except (UserError, OSError, RuntimeError) as exc:
                if disk_full(exc):
                    raise  # the pipeline stops; the relaunch submits it
                return self.not_submitted(f"submission failed: {exc}")
            self.say(f"step {self.name}: job {spec.name} submitted to backend={backend.name}")
        else:
            self.say(f"step {self.name}: following job {spec.name} again")
        self.handle = handle
        if self.stopping:
            backend.stop(handle)
        tracker = self.runs.open()  # MLflow starts up while the job runs
        log_path = job_log(job.base_dir, spec.name)
        tracked = tracker.find_run(spec.name)
        if tracked is not None and tracked.status in TERMINAL_RUN_STATUSES:
            # it ended and its run was closed; the launcher that saw it died before saying so
            monitor = JobMonitor(backend, handle, spec, log_path)
            status = backend.poll([handle])[handle.id]
            monitor.pull(final=True)
            return self.outcome(tracked.run_id, monitor.result(status))
        logged = None
        if tracked is None:
            run_id = self.create_run(tracker)
        else:  # a launcher that is gone followed it: follow it on, metrics logged once
            run_id = tracked.run_id
            logged = tracker.logged_steps(run_id)
        backend.label(handle, {"paiexp-run": run_id})
        tracker.set_tags(run_id, {"paiexp.job_id": handle.id, "paiexp.status": "SUBMITTED"})
        result = follow(
            backend,
            handle,
            spec,
            tracker,
            run_id,
            job.base_dir,
            echo=self.echo,
            logged=logged,
            prices=prices_of(job.config.backend),
        )
        return self.outcome(run_id, result)

    def create_run(self, tracker: MlflowTracker) -> str:
        job = self.job
        record = make_record(job.data, job.spec, project_dir=job.base_dir, overrides=job.overrides)
        tags = self.runs.step_tags(self.name, self.digest)
        run_id = tracker.create_run(record, run_name=self.name, extra_tags=tags)
        tracker.log_record(run_id, record)
        return run_id

    def not_submitted(self, reason: str) -> StepOutcome:
        tracker = self.runs.open()
        run_id = self.create_run(tracker)
        tracker.fail(run_id, reason)
        return StepOutcome(StepStatus.failed, run_id=run_id, note=reason)

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
