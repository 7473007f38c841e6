"""The sweep's loop: every in-flight job served by one poll per tick, slots refilled at once.

Each tick: submit while a slot is free and the budget allows; poll all jobs in one backend
call; read each job's new log lines; report the pruning metric's new steps and stop a job the
pruner condemns; tell a trial the moment its job ends.  Every LOG_PULL seconds, every running
job's log is read and the new metric points of all of them go to their runs in one call: a
running trial's curves reach MLflow a few seconds behind its log.  An interrupt stops
submitting, then stops the running jobs (``on_interrupt: stop``) or leaves them running for
the next launch (``detach``; a SIGTERM always detaches).

Once per heartbeat interval, and before it acts on a trial once that is due, the loop
heartbeats (see :mod:`paiexp.sweep.ownership`) and adopts the trials of launchers that are
gone.  With its budget spent, it waits for the trials launchers on other hosts follow, so
that one of them that dies is still adopted.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from paiexp.backends import BackendUnavailable, JobState, JobStatus
from paiexp.config.schema import InterruptMode
from paiexp.config.spec import JobSpec
from paiexp.metrics.extraction import MetricPoint
from paiexp.sweep.ownership import trial_id
from paiexp.sweep.records import PRUNING
from paiexp.sweep.resume import Adopter
from paiexp.sweep.trial_jobs import InFlight, TrialJobs
from paiexp.tracking.monitor import JobResult
from paiexp.util.diskfull import DiskFull, nearly_full, says_disk_full

if TYPE_CHECKING:
    from optuna import Study

    from paiexp.config.schema import SweepConfig
    from paiexp.sweep.budget import TrialBudget
    from paiexp.sweep.progress import Progress
    from paiexp.sweep.study import Objective, PruningSignal
    from paiexp.sweep.tracker_protocol import Tracker


# Seconds between reads of the running jobs' logs (every tick when a pruner needs them), and
# between sends of their new points to their runs.
LOG_PULL = 5.0


class Scheduler:
    def __init__(
        self,
        jobs: TrialJobs,
        budget: TrialBudget,
        sweep: SweepConfig,
        pruning: PruningSignal | None,
        tracker: Tracker,
        progress: Progress,
    ) -> None:
        self.jobs = jobs
        self.budget = budget
        self.sweep = sweep
        self.pruning = pruning
        self.tracker = tracker
        self.progress = progress
        self.backend = jobs.backend
        self.inflight: list[InFlight] = []
        self.interrupts = 0
        self.on_interrupt = sweep.on_interrupt  # a SIGTERM makes it detach
        self.stop_reason: str | None = None
        self.stop_failed = False  # stopped by failures (max_failures, tracking, refusal)
        self.started = time.monotonic()
        self.adopter = Adopter(jobs, progress)
        self.waiting_for: set[int] = set()  # other launchers' trials awaited at the end
        self.trial_ended = threading.Event()  # set as the first of its trials ends
        self.pulled = -math.inf  # when the running jobs' logs were last read (monotonic)

    @property
    def study(self) -> Study:
        return self.jobs.study

    @property
    def running(self) -> int:
        return len(self.inflight)

    def follow(self, flights: Iterable[InFlight]) -> None:
        """Serve jobs launched elsewhere (adopted from a launcher that is gone)."""
        self.inflight.extend(flights)

    def interrupt(self, *, detach: bool = False) -> None:
        """Ctrl-C: no new trials, running jobs stopped or detached (``sweep.on_interrupt``;
        ``detach``: detached whatever it says); a second one exits."""
        self.interrupts += 1
        if self.interrupts > 1:
            raise KeyboardInterrupt  # leave at once; the study resumes
        if detach:
            self.on_interrupt = InterruptMode.detach
        action = (
            "stopping running jobs"
            if self.on_interrupt == "stop"
            else "leaving running jobs to a later launch"
        )
        self.progress.say(f"interrupted: no new trials; {action} (Ctrl-C again to exit at once)")

    def run(self) -> None:
        """Run trials until the budget is spent or the sweep stops, and their jobs ended."""
        self.follow(self.adopter.check())  # before the first heartbeat is due
        while True:
            self._hold()
            self._check_tracking_disk()
            if self.interrupts:
                if self.on_interrupt == "detach":
                    return  # trials stay RUNNING; the next launch re-attaches to their jobs
                self._stop_all()
            while self._may_submit():
                self._hold()
                flight = self.jobs.start()  # counts the budget, one launcher at a time
                if flight is not None:
                    self.inflight.append(flight)
                elif self.jobs.blocked:
                    break
            if not self.inflight:
                if self.interrupts or self.stop_reason or not self._await_others():
                    return
                continue
            self.jobs.label_runs()
            handles = [f.handle for f in self.inflight]
            try:
                statuses = self.backend.poll(handles)
            except BackendUnavailable as exc:  # the jobs run on regardless: ask again later
                self.progress.say(f"backend unavailable, polling again: {exc}")
                self.backend.wait(handles, self.backend.poll_interval)
                continue
            now = time.monotonic()
            pull_all = now - self.pulled >= LOG_PULL
            if pull_all:
                self.pulled = now
            for flight in [f for f in self.inflight if f.handle.id in statuses]:
                status = statuses[flight.handle.id]
                if not (status.state.terminal or pull_all or self.pruning is not None):
                    continue  # nothing to act on: no heartbeat due before it either
                points = flight.monitor.pull(final=status.state.terminal)
                self._hold()
                if flight not in self.inflight:
                    continue  # taken over by another launcher while this one was silent
                if status.state.terminal:
                    self.inflight.remove(flight)
                    self._complete(flight, status)
                elif points:
                    self._observe(flight, points)
            if pull_all:
                self.jobs.log_points(self.inflight)
            self.progress.refresh()
            if self.inflight and not self._slot_free():
                self.backend.wait([f.handle for f in self.inflight], self.backend.poll_interval)

    def _hold(self) -> None:
        """When due: the study's best on the parent run (other launchers' trials may have
        beaten it), a heartbeat (after a silence, claim this launcher's trials again and drop
        those another launcher took), then adopt the trials of launchers that are gone."""
        lease = self.jobs.lease
        if not lease.due():
            return
        self.jobs.publish_best(changed_only=True)  # other launchers' better trials too
        if lease.fresh():
            lease.beat()
        else:
            lost = set(lease.renew({f.trial.number: trial_id(f.trial) for f in self.inflight}))
            for flight in [f for f in self.inflight if f.trial.number in lost]:
                self.inflight.remove(flight)
                self.progress.say(
                    f"trial {flight.trial.number}: another launcher took it over while this "
                    "one was silent; left to it"
                )
        self.follow(self.adopter.check())

    def _await_others(self) -> bool:
        """With nothing of its own to run: whether trials of other launchers still run (this
        launcher waits to adopt them if their launcher goes); sleeps until the next check."""
        others = self.adopter.others
        if not others:
            return False
        if set(others) != self.waiting_for:
            self.waiting_for = set(others)
            owners = sorted({str(owner).split(":")[0] for owner in others.values()})
            self.progress.say(
                f"waiting for {len(others)} trials other launchers follow "
                f"({', '.join(owners)}), to adopt them if their launcher goes"
            )
        self.progress.refresh()
        time.sleep(min(self.jobs.lease.interval, 1.0))
        return True

    def _stop_all(self) -> None:
        for flight in list(self.inflight):
            if not flight.interrupted:
                flight.interrupted = True
                self.backend.stop(flight.handle)

    def _slot_free(self) -> bool:
        return len(self.inflight) < self.sweep.parallelism and self._can_submit()

    def _can_submit(self) -> bool:
        return self._may_submit() and self.budget.counted() < self.sweep.n_trials

    def _may_submit(self) -> bool:
        """Whether a slot is free and nothing stops the sweep (the budget aside)."""
        self._check_tracking_failed()  # slots taken or not: it is said at once
        if self.stop_reason or len(self.inflight) >= self.sweep.parallelism:
            return False
        stop = self._why_stop()
        if stop is not None:
            self.stop_reason, self.stop_failed = stop
            return False
        return True

    def _why_stop(self) -> tuple[str, bool] | None:
        """Why no more trials may start, if so, and whether that fails the sweep."""
        sweep = self.sweep
        self._check_tracking_disk()  # before its error is taken for tracking's failure
        if self.jobs.refused:
            return self.jobs.refused, True
        if self.interrupts:
            return "interrupted", False
        if sweep.timeout is not None and time.monotonic() - self.started > sweep.timeout:
            return f"sweep.timeout of {sweep.timeout:g} s reached", False
        if sweep.max_failures is not None:
            failures = self.budget.failures()
            if failures >= sweep.max_failures:
                reason = (
                    f"{failures} trials failed (sweep.max_failures={sweep.max_failures}); "
                    "see their failure reasons"
                )
                return reason, True
        limit = self.jobs.limit
        if limit is not None and self.budget.counted() < sweep.n_trials:
            spent = limit.why_stop(self.study)
            if spent is not None:
                return spent, False
        return None

    def _check_tracking_disk(self) -> None:
        """Stop the sweep when MLflow's store could not be written for a full disk."""
        if self.tracker.disk_full:
            raise self.tracker.disk_full

    def _check_tracking_failed(self) -> None:
        """No new trials once MLflow tracking failed for good, said as soon as it did (not
        when a slot frees): the running trials run to their end."""
        if self.stop_reason or not self.tracker.fatal:
            return
        self.stop_reason = f"MLflow tracking failed: {self.tracker.fatal}"
        self.stop_failed = True
        self.progress.say(f"no new trials: {self.stop_reason}; the running ones run to their end")

    def _observe(self, flight: InFlight, points: list[MetricPoint]) -> None:
        """Report the pruning metric's new steps; stop the job when Optuna says prune."""
        pruning = self.pruning
        if pruning is None or flight.pruning or flight.interrupted:
            return
        from paiexp.sweep.journal import one_append  # Optuna's: not for a sweep refused early

        reported = False
        with one_append(self.study):
            for point in points:
                if point.name == pruning.metric and point.step not in flight.reported:
                    flight.trial.report(pruning.sign * point.value, point.step)
                    flight.reported.add(point.step)
                    reported = True
        if reported and flight.trial.should_prune():
            flight.pruning = True
            flight.trial.set_user_attr(PRUNING, True)
            self.backend.stop(flight.handle)

    def _complete(self, flight: InFlight, status: JobStatus) -> None:
        from optuna.trial import TrialState

        self.trial_ended.set()
        result = flight.monitor.result(status)
        if flight.pruning:
            self.jobs.tell(flight, TrialState.PRUNED, result=result)
        elif status.state is JobState.SUCCEEDED:
            values, problem = objective_values(self.jobs.objectives, flight.spec, result)
            if problem:
                self.jobs.tell(flight, TrialState.FAIL, result=result, reason=problem)
            else:
                self.jobs.tell(flight, TrialState.COMPLETE, result=result, values=values)
        elif flight.interrupted:
            reason = "interrupted: the sweep was stopped"
            self.jobs.tell(flight, TrialState.FAIL, result=result, reason=reason, rerun=True)
        else:
            reason = status.reason or f"job {status.state.value.lower()}"
            platform = status.infrastructure or says_disk_full(result.log_tail)
            rerun = platform and self.budget.may_retry(flight.trial)
            self.jobs.tell(
                flight,
                TrialState.FAIL,
                result=result,
                reason=reason,
                rerun=rerun,
                preempted=status.preempted,
                detail=last_line(result.log_tail),
            )
            if status.full_disk and nearly_full(status.full_disk):  # still: so would the next
                raise DiskFull(status.full_disk, "no space left on device", reason)


def objective_values(
    objectives: Sequence[Objective], spec: JobSpec, result: JobResult
) -> tuple[list[float], str | None]:
    """The objectives' values a job printed, or why there are none to tell."""
    regexes = {d.name: d.regex for d in spec.metric_definitions}
    values = []
    for objective in objectives:
        value = result.metrics.get(objective.metric)
        if value is None and objective.metric in regexes:
            last = last_line(result.log_tail)
            return [], (
                f"objective metric {objective.metric!r} never matched regex "
                f"{regexes[objective.metric]!r}; "
                + (f"the log's last line: {last!r}" if last else "the log is empty")
            )
        if value is None:
            why = result.unreported.get(objective.metric, "it was never reported")
            return [], f"objective metric {objective.metric!r}: {why}"
        if math.isnan(value):
            return [], f"objective metric {objective.metric!r} is NaN"
        values.append(value)
    return values, None


def last_line(lines: Sequence[str]) -> str | None:
    """The last line of a log tail that holds anything (a script's own error, most often)."""
    return next((line.strip() for line in reversed(lines) if line.strip()), None)
