"""The launcher against an in-memory backend and a recording tracker: no processes, no sleeps.

Real Optuna (a journal file per test), real config composition; jobs are scripted by their
hyperparameter ``x`` (see ``fake_backend``), and time moves only when the launcher waits.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fake_backend import FakeBackend, Script
from rich.console import Console
from sweep_helpers import synthetic_project, third_trial_pruned

from paiexp.backends import JobState
from paiexp.config.compose import compose, locate_project, to_object
from paiexp.config.spec import JobSpec
from paiexp.sweep import scheduler
from paiexp.sweep.launcher import Launcher
from paiexp.sweep.opening import open_study
from paiexp.sweep.prepared import PreparedSweep, SweepOutcome, prepare_sweep
from paiexp.sweep.progress import Progress
from paiexp.sweep.records import JOB_NAME, OWNER, job_name
from paiexp.sweep.resume import reopen
from paiexp.sweep.tracker_protocol import Tracker
from paiexp.sweep.tracking_messages import (
    Call,
    FailChild,
    FinishChild,
    FinishParent,
    LogPoints,
    StartChild,
    TrackingSetup,
)

C = TypeVar("C", bound=Call)
INSPECTOR = "inspector:1:0"  # who opens a study in a test to look at it or change it


class RecordingTracker(Tracker):
    """The tracker's calls, recorded; every child run exists as soon as it is started."""

    def __init__(self, setup: TrackingSetup) -> None:
        super().__init__()
        self.setup = setup
        self.calls: list[Call] = []
        self.closed = False

    def send(self, call: Call) -> None:
        self.calls.append(call)
        if isinstance(call, StartChild):
            self._run_ids[call.job_name] = f"run-{call.job_name}"

    def take_replies(self) -> None:
        pass  # nothing fails, every run exists at once

    def close(self) -> str | None:
        self.closed = True
        return "sqlite:///recorded.db"

    def sent(self, kind: type[C]) -> list[C]:
        return [c for c in self.calls if isinstance(c, kind)]


@dataclasses.dataclass
class Launch:
    outcome: SweepOutcome
    tracker: RecordingTracker
    said: str  # what the terminal showed

    def trials(self) -> list[tuple[str, dict[str, Any]]]:
        return [(t.state.name, t.user_attrs) for t in self.outcome.study.trials]


def x_of(spec: JobSpec) -> float:
    return float(spec.hyperparameters["x"])


def scored(x: float, steps: int = 2) -> Script:
    """A job that prints ``steps`` losses, then its score x**2."""
    losses = tuple(f"loss={x * x + 1.0 / (step + 1):.6f}" for step in range(steps))
    return Script((*losses, f"score={x * x!r}"))


def prepare(tmp_path: Path, backend: FakeBackend, **sweep: Any) -> PreparedSweep:
    root = synthetic_project(
        tmp_path, {"params": {"x": "interval(-1, 1)"}, "sampler": {"name": "random"}, **sweep}
    )
    project = locate_project(str(root / "conf"))
    cfg = compose(project, ["+sweep=syn"])
    prepared = prepare_sweep(cfg, to_object(cfg), project.base_dir, ("+sweep=syn",))
    return dataclasses.replace(prepared, backend=backend)


class LaggingTracker(RecordingTracker):
    """A tracker whose tracking process has made no trial's run yet."""

    def send(self, call: Call) -> None:
        self.calls.append(call)


def launch(prepared: PreparedSweep, tracker: type[RecordingTracker] = RecordingTracker) -> Launch:
    trackers: list[RecordingTracker] = []

    def factory(setup: TrackingSetup) -> RecordingTracker:
        trackers.append(tracker(setup))
        return trackers[-1]

    console = Console(file=io.StringIO(), width=200)
    progress = Progress(prepared.sweep.n_trials, prepared.objectives, console=console)
    outcome = Launcher(prepared, progress, tracker_factory=factory).run()
    assert isinstance(console.file, io.StringIO)
    return Launch(outcome, trackers[0], console.file.getvalue())


def interrupt_at(step: int) -> Callable[[int], None]:
    """Ctrl-C, as the terminal sends it, once time reaches ``step``."""

    def on_step(now: int) -> None:
        if now == step:
            signal.raise_signal(signal.SIGINT)

    return on_step


# -- scheduling ----------------------------------------------------------------------------


def test_n_trials_is_exact_and_parallelism_is_never_exceeded(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=3))
    run = launch(prepare(tmp_path, backend, n_trials=5, parallelism=3))
    assert [state for state, _ in run.trials()] == ["COMPLETE"] * 5
    assert len(backend.created) == len(set(backend.created)) == 5
    assert backend.concurrency == 3
    assert backend.most_running == 3
    assert [c.status for c in run.tracker.sent(FinishChild)] == ["FINISHED"] * 5
    assert run.outcome.stop_reason is None and not run.outcome.failed
    assert isinstance(run.tracker.calls[-1], FinishParent)


def test_a_slot_is_refilled_the_moment_a_trial_ends(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=round(x_of(spec) * 10)))
    prepared = prepare(
        tmp_path, backend, n_trials=3, parallelism=2, enqueue=[{"x": 0.1}, {"x": 0.9}, {"x": 0.2}]
    )
    launch(prepared)
    short, long, third = (backend.jobs[name] for name in backend.created)
    assert short.ended_at is not None and long.ended_at is not None
    assert third.created_at == short.ended_at  # not one step later
    assert third.created_at < long.ended_at  # no waiting for the batch


def test_running_trials_points_go_to_their_runs_together_and_their_finish_has_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler, "LOG_PULL", 0.0)  # every tick: every log read, points sent
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=3))
    run = launch(prepare(tmp_path, backend, n_trials=4, parallelism=2))
    assert [state for state, _ in run.trials()] == ["COMPLETE"] * 4
    calls = run.tracker.calls
    sent = run.tracker.sent(LogPoints)
    assert any(len(call.points) == 2 for call in sent)  # both trials' points in one call
    for finish in run.tracker.sent(FinishChild):
        job = finish.job_name
        live = [p for call in sent for p in call.points.get(job, ())]
        assert live, f"{job}: no point sent while it ran"
        series = [(p.name, p.step) for p in [*live, *finish.unlogged]]
        assert series == [("loss", 0), ("loss", 1), ("loss", 2), ("score", 0)], job
        last = max(i for i, c in enumerate(calls) if isinstance(c, LogPoints) and job in c.points)
        assert last < calls.index(finish)


def test_a_trials_points_wait_for_its_run_to_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the tracking process has made a trial's run, its points stay with the launcher:
    all of them go with its finish, which may then be joined with its start."""
    monkeypatch.setattr(scheduler, "LOG_PULL", 0.0)
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=3))
    run = launch(prepare(tmp_path, backend, n_trials=2, parallelism=2), LaggingTracker)
    assert run.tracker.sent(LogPoints) == []
    for finish in run.tracker.sent(FinishChild):
        series = [(p.name, p.step) for p in finish.unlogged]
        assert series == [("loss", 0), ("loss", 1), ("loss", 2), ("score", 0)]


# -- failures and retries ------------------------------------------------------------------


@pytest.mark.slow
def test_an_infrastructure_failure_is_rerun_within_retries_and_counted_once(
    tmp_path: Path,
) -> None:
    def script(spec: JobSpec) -> Script:
        if x_of(spec) == 0.5:
            return Script(state=JobState.FAILED, reason="the node died", infrastructure=True)
        return scored(x_of(spec))

    backend = FakeBackend(script)
    prepared = prepare(
        tmp_path, backend, n_trials=2, parallelism=1, retries=1, enqueue=[{"x": 0.5}]
    )
    run = launch(prepared)
    trials = run.outcome.study.trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "COMPLETE"]
    assert trials[0].user_attrs["paiexp:retried"] is True  # re-run once...
    assert trials[1].params == trials[0].params
    assert trials[1].user_attrs["paiexp:attempt"] == 1
    assert "paiexp:retried" not in trials[1].user_attrs  # ...and no more: retries=1
    assert trials[1].user_attrs["paiexp:failure_reason"] == "the node died"
    assert trials[2].params["x"] != 0.5  # the point counted once: one new trial to n_trials=2
    assert len(backend.created) == 3


def test_a_script_failure_is_not_retried(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: Script(state=JobState.FAILED, reason="exit code 3"))
    run = launch(prepare(tmp_path, backend, n_trials=2, parallelism=1, retries=2))
    assert [(s, a.get("paiexp:retried")) for s, a in run.trials()] == [("FAIL", None)] * 2
    assert all(a["paiexp:failure_reason"] == "exit code 3" for _, a in run.trials())
    assert [c.status for c in run.tracker.sent(FinishChild)] == ["FAILED"] * 2
    assert not run.outcome.failed  # failed trials do not fail a sweep without max_failures


def test_max_failures_stops_submitting_and_says_why(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: Script(state=JobState.FAILED, reason="exit code 3"))
    run = launch(prepare(tmp_path, backend, n_trials=6, parallelism=1, max_failures=2))
    assert [state for state, _ in run.trials()] == ["FAIL", "FAIL"]
    assert len(backend.created) == 2
    assert run.outcome.failed
    assert run.outcome.stop_reason == (
        "2 trials failed (sweep.max_failures=2); see their failure reasons"
    )


def test_an_unusable_objective_fails_the_trial_with_the_logs_last_line(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: Script(("loss=1.0", "done")))
    run = launch(prepare(tmp_path, backend, n_trials=1))
    ((state, attrs),) = run.trials()
    reason = attrs["paiexp:failure_reason"]
    assert state == "FAIL"
    assert reason.startswith("objective metric 'score' never matched regex")
    assert reason.endswith("; the log's last line: 'done'")


# -- submission refused --------------------------------------------------------------------


def test_a_rejected_job_fails_its_trial_and_the_sweep_goes_on(tmp_path: Path) -> None:
    def script(spec: JobSpec) -> Script:
        if x_of(spec) == 0.5:
            return Script(rejected="instance type ecs.gn7 is not offered here")
        return scored(x_of(spec))

    backend = FakeBackend(script)
    prepared = prepare(tmp_path, backend, n_trials=3, retries=2, enqueue=[{"x": 0.5}])
    run = launch(prepared)
    states = [(s, a.get("paiexp:retried")) for s, a in run.trials()]
    assert states == [("FAIL", None), ("COMPLETE", None), ("COMPLETE", None)]
    reason = "job rejected: instance type ecs.gn7 is not offered here"
    assert run.trials()[0][1]["paiexp:failure_reason"] == reason
    rejected = run.trials()[0][1][JOB_NAME]
    assert run.tracker.sent(FailChild) == [FailChild(rejected, reason)]
    assert rejected not in backend.created
    assert run.outcome.stop_reason is None and not run.outcome.failed


def test_a_job_the_platform_refuses_stops_the_sweep(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: Script(refused="the workspace has no quota"))
    run = launch(prepare(tmp_path, backend, n_trials=3, retries=2))
    assert [state for state, _ in run.trials()] == ["FAIL"]
    assert run.outcome.failed
    assert run.outcome.stop_reason == "submission rejected: the workspace has no quota"


# -- pruning -------------------------------------------------------------------------------


@pytest.mark.parametrize(("objective_direction", "sign"), [("minimize", 1.0), ("maximize", -1.0)])
def test_the_pruner_gets_its_metric_in_the_studys_direction_and_condemned_jobs_stop(
    tmp_path: Path, objective_direction: str, sign: float
) -> None:
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=20))
    prepared = prepare(
        tmp_path,
        backend,
        objective={"metric": "score", "direction": objective_direction},
        **third_trial_pruned({"x": "interval(-1, 1)"}, worst_x=0.9),
    )
    run = launch(prepared)
    trials = run.outcome.study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert trials[0].intermediate_values[3] == pytest.approx(sign * 0.25)  # loss=1/(step+1)
    pruned = trials[2]
    name = pruned.user_attrs[JOB_NAME]
    assert backend.stopped == [name]
    assert backend.jobs[name].printed < 20  # stopped early
    assert max(pruned.intermediate_values) >= 1
    finished = run.tracker.sent(FinishChild)[-1]
    assert (finished.job_name, finished.status) == (name, "KILLED")


# -- interrupts ----------------------------------------------------------------------------


def test_ctrl_c_stops_the_jobs_and_their_points_wait_to_run_again(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=10), on_step=interrupt_at(2))
    run = launch(prepare(tmp_path, backend, n_trials=4, parallelism=2))
    trials = run.outcome.study.trials
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "WAITING", "WAITING"]
    assert sorted(backend.stopped) == sorted(backend.created) and len(backend.created) == 2
    assert all(
        t.user_attrs["paiexp:failure_reason"] == "interrupted: the sweep was stopped"
        for t in trials[:2]
    )
    assert [t.user_attrs["paiexp:retry_of"] for t in trials[2:]] == [0, 1]
    assert all(t.user_attrs["paiexp:attempt"] == 0 for t in trials[2:])  # not a failed attempt
    assert run.outcome.interrupted and run.outcome.stop_reason == "interrupted"
    assert not run.outcome.failed
    assert [call.interrupted for call in run.tracker.sent(FinishParent)] == [True]
    assert "interrupted: no new trials; stopping running jobs" in run.said


def test_ctrl_c_with_detach_leaves_the_jobs_running(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=10), on_step=interrupt_at(2))
    run = launch(prepare(tmp_path, backend, n_trials=4, parallelism=2, on_interrupt="detach"))
    assert [state for state, _ in run.trials()] == ["RUNNING", "RUNNING"]
    assert backend.stopped == []
    assert len(backend.running()) == 2
    assert run.outcome.interrupted
    assert run.tracker.sent(FinishChild) == []
    assert "leaving running jobs to a later launch" in run.said


# -- resume --------------------------------------------------------------------------------


def detached_sweep(tmp_path: Path, **sweep: Any) -> tuple[FakeBackend, PreparedSweep]:
    """A sweep whose launcher detached from two running jobs and then died."""
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=10), on_step=interrupt_at(2))
    prepared = prepare(tmp_path, backend, parallelism=2, on_interrupt="detach", **sweep)
    launch(prepared)
    backend.on_step = None
    study = open_study(prepared, INSPECTOR).study
    dead = f"{socket.gethostname()}:{os.getpid()}:0"  # this pid, another start: gone
    for frozen in study.trials:
        reopen(study, frozen).set_user_attr(OWNER, dead)
    return backend, prepared


def test_a_resumed_sweep_adopts_orphaned_trials_and_reattaches_by_job_name(
    tmp_path: Path,
) -> None:
    backend, prepared = detached_sweep(tmp_path, n_trials=4)
    opened = open_study(prepared, INSPECTOR)
    study = opened.study
    running = [frozen.user_attrs[JOB_NAME] for frozen in study.trials]
    unsubmitted = study.ask(prepared.space.distributions())  # its launcher died before
    unsubmitted_name = job_name("syn", opened.sweep_id, unsubmitted.number)  # submitting
    unsubmitted.set_user_attr(JOB_NAME, unsubmitted_name)

    run = launch(prepared)
    assert [state for state, _ in run.trials()] == ["COMPLETE"] * 4
    assert len(backend.created) == len(set(backend.created)) == 4  # no job ran twice
    assert backend.created[:3] == [*running, unsubmitted_name]
    adopted = [(name, True) for name in [*running, unsubmitted_name]]
    assert [(c.job_name, c.adopted) for c in run.tracker.sent(StartChild)[:3]] == adopted
    assert all(f"re-attaching to job {name}" in run.said for name in running)
    assert all(a[OWNER] != f"{socket.gethostname()}:{os.getpid()}:0" for _, a in run.trials())


def test_a_job_lost_while_no_launcher_watched_fails_and_is_rerun(tmp_path: Path) -> None:
    backend, prepared = detached_sweep(tmp_path, n_trials=2, retries=1)
    lost, kept = (
        frozen.user_attrs[JOB_NAME] for frozen in open_study(prepared, INSPECTOR).study.trials
    )
    backend.lose(lost)

    run = launch(prepared)
    trials = run.outcome.study.trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials[0].user_attrs["paiexp:failure_reason"] == (
        f"job {lost} was lost (not found after a restart)"
    )
    assert trials[0].user_attrs["paiexp:retried"] is True
    assert trials[2].params == trials[0].params and trials[2].user_attrs["paiexp:attempt"] == 1
    assert FailChild(lost, f"job {lost} was lost (not found after a restart)") in run.tracker.sent(
        FailChild
    )
    assert backend.created.count(kept) == 1  # re-attached, not resubmitted


def test_trials_of_a_live_launcher_are_left_to_it(tmp_path: Path) -> None:
    backend = FakeBackend(lambda spec: scored(x_of(spec), steps=10), on_step=interrupt_at(2))
    prepared = prepare(tmp_path, backend, n_trials=2, parallelism=2, on_interrupt="detach")
    launch(prepared)  # its owner, this process, is alive
    backend.on_step = None

    run = launch(prepared)
    assert [state for state, _ in run.trials()] == ["RUNNING", "RUNNING"]
    assert run.tracker.sent(StartChild) == []
    assert len(backend.created) == 2
