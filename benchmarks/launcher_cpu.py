"""The launcher's CPU per trial by function family, without a profiler's overhead.

Runs the sweep of ``benchmarks/scale.py`` (sleep jobs, backend=local, journal storage,
``./mlflow.db``) in this process, with the main thread's CPU time (``time.thread_time``)
summed around a few entry points of the launcher's loop, and prints each in ms per trial
next to the whole process's CPU per trial.  Figures are inclusive: a family's callees that
are listed too are counted in both (``Trial.set_user_attr`` within ``TrialJobs.tell``).

    python benchmarks/launcher_cpu.py [--trials 200] [--parallelism 32]
        [--min-duration 5] [--max-duration 20] [--sampler random]
    python benchmarks/launcher_cpu.py --quick     # seconds: scale.py's quick sweep
"""

from __future__ import annotations

import argparse
import functools
import resource
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_harness import parse_args
from scale import QUICK_WORKLOAD, prepare_here, workload_options

SPENT: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def timed(owner: Any, attribute: str, label: str) -> None:
    """Sum the calling thread's CPU time in ``owner.attribute`` under ``label``."""
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            SPENT[label] += time.thread_time() - started
            CALLS[label] += 1

    setattr(owner, attribute, wrapper)


def instrument() -> None:
    import optuna
    from optuna.trial import Trial

    from paiexp.backends.jobdir import JobDirectories
    from paiexp.backends.local import LocalBackend, StandbyRunner
    from paiexp.sweep.budget import TrialBudget
    from paiexp.sweep.claims import FileClaims
    from paiexp.sweep.ownership import Lease
    from paiexp.sweep.progress import Progress
    from paiexp.sweep.resume import Adopter
    from paiexp.sweep.scheduler import Scheduler
    from paiexp.sweep.tracker_protocol import Tracker
    from paiexp.sweep.trial_jobs import TrialJobs
    from paiexp.tracking.monitor import JobMonitor

    families: list[tuple[Any, str, str]] = [
        (Scheduler, "run", "scheduler loop (all)"),
        (TrialJobs, "start", "TrialJobs.start (ask+claim+launch)"),
        (optuna.Study, "ask", "  Study.ask"),
        (FileClaims, "claim", "  claims.claim"),
        (TrialJobs, "launch", "  TrialJobs.launch"),
        (TrialJobs, "spec", "    TrialJobs.spec"),
        (LocalBackend, "submit", "    LocalBackend.submit"),
        (JobDirectories, "create", "      JobDirectories.create"),
        (LocalBackend, "_environment", "      LocalBackend._environment"),
        (LocalBackend, "_start_runner", "      LocalBackend._start_runner"),
        (StandbyRunner, "hand_over", "        StandbyRunner.hand_over"),
        (TrialJobs, "start_child", "    TrialJobs.start_child"),
        (JobMonitor, "__init__", "    JobMonitor.__init__"),
        (Trial, "set_user_attr", "  Trial.set_user_attr (all)"),
        (LocalBackend, "poll", "LocalBackend.poll"),
        (LocalBackend, "wait", "LocalBackend.wait (CPU only)"),
        (JobMonitor, "pull", "JobMonitor.pull (log and event-file reads)"),
        (TrialJobs, "log_points", "TrialJobs.log_points (running trials' points sent)"),
        (Scheduler, "_complete", "Scheduler._complete"),
        (JobMonitor, "result", "  JobMonitor.result"),
        (TrialJobs, "tell", "  TrialJobs.tell"),
        (optuna.Study, "tell", "    Study.tell"),
        (Tracker, "finish_child", "    Tracker.finish_child"),
        (Progress, "finished", "    Progress.finished"),
        (TrialJobs, "publish_best", "    TrialJobs.publish_best"),
        (TrialJobs, "label_runs", "TrialJobs.label_runs"),
        (TrialBudget, "counted", "TrialBudget.counted"),
        (Scheduler, "_hold", "Scheduler._hold (heartbeat, adopt)"),
        (Lease, "beat", "  Lease.beat"),
        (Adopter, "check", "  Adopter.check"),
        (Progress, "refresh", "Progress.refresh"),
    ]
    for owner, attribute, label in families:
        timed(owner, attribute, label)
    LABELS.extend(label for _, _, label in families)


LABELS: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, trials=200, parallelism=32, min_duration=5, max_duration=20)
    parser.add_argument("--sampler", default="random")
    args = parse_args(parser, **QUICK_WORKLOAD)

    from paiexp.sweep.launcher import Launcher
    from paiexp.sweep.progress import Progress

    root = Path(tempfile.mkdtemp(prefix="paiexp-cpu-"))
    prepared = prepare_here(root, args, args.sampler)
    instrument()

    before = resource.getrusage(resource.RUSAGE_SELF)
    main_before = time.thread_time()
    Launcher(prepared, Progress(args.trials, prepared.objectives)).run()
    main_cpu = time.thread_time() - main_before
    after = resource.getrusage(resource.RUSAGE_SELF)
    shutil.rmtree(root, ignore_errors=True)

    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    n = args.trials
    print(
        f"{n} trials of {args.min_duration:g}-{args.max_duration:g} s at parallelism "
        f"{args.parallelism}, {args.sampler} sampler"
    )
    print(
        f"launcher process CPU {1000 * (user + system) / n:.2f} ms per trial "
        f"(user {1000 * user / n:.2f}, system {1000 * system / n:.2f}); "
        f"main thread {1000 * main_cpu / n:.2f}"
    )
    print("\n  ms/trial  calls/trial  family (main thread CPU, inclusive)")
    for label in LABELS:
        print(f"  {1000 * SPENT[label] / n:8.2f}  {CALLS[label] / n:11.2f}  {label}")


if __name__ == "__main__":
    main()
