"""Slot utilization of paiexp's asynchronous launcher against a batch-synchronous loop.

24 sleep jobs (``--jobs``) whose duration (0.2-2.0 s) is their one parameter run at
parallelism 4, three ways, in this one run and with the same durations in the same order:

- paiexp: the sweep launcher (local backend, Optuna journal storage, MLflow tracking);
- batch: ask 4 trials, run their jobs (same backend), wait for all 4, tell, repeat
  (what hydra-optuna-sweeper does);
- ideal: a zero-overhead greedy schedule of the same durations, computed.

Slot utilization = sum(durations) / (4 x makespan); paiexp's makespan runs from its loop's
start to its last trial told. Goals: paiexp >= 0.95 x ideal and >= 1.25 x batch.

    python benchmarks/async_efficiency.py [--seed 0] [--jobs 24]
    python benchmarks/async_efficiency.py --quick     # seconds: 4 jobs
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from bench_harness import parse_args
from bench_project import write_project

SLOTS = 4
JOB = {
    "name": "sleeper",
    "command": "sleep $PAI_HPS_DURATION; echo score=$PAI_HPS_DURATION",
    "hyperparameters": {"duration": 0.2},
    "metric_definitions": [{"name": "score", "regex": r"score=([0-9.]+)"}],
}


def make_project(root: Path, durations: list[float]) -> None:
    sweep = {
        "objective": {"metric": "score", "direction": "minimize"},
        "params": {"duration": "interval(0.2, 2.0)"},
        "n_trials": len(durations),
        "parallelism": SLOTS,
        "sampler": {"name": "random", "seed": 0},
        "enqueue": [{"duration": d} for d in durations],
    }
    write_project(root, JOB, "sleep", sweep)


def ideal_makespan(durations: list[float]) -> float:
    """Greedy list scheduling with no overhead: each job starts when a slot frees."""
    slots = [0.0] * SLOTS
    for duration in durations:
        heapq.heappush(slots, heapq.heappop(slots) + duration)
    return max(slots)


def run_paiexp(root: Path, jobs: int) -> float:
    from paiexp.config.compose import compose as compose_config
    from paiexp.config.compose import locate_project, to_object
    from paiexp.sweep.launcher import Launcher
    from paiexp.sweep.prepared import prepare_sweep
    from paiexp.sweep.progress import Progress
    from paiexp.sweep.scheduler import Scheduler

    project = locate_project(str(root / "conf"))
    cfg = compose_config(project, ["+sweep=sleep"])
    config = to_object(cfg)
    prepared = prepare_sweep(cfg, config, project.base_dir, ("+sweep=sleep",))
    launcher = Launcher(prepared, Progress(jobs, prepared.objectives))
    marks: dict[str, float] = {}
    loop = Scheduler.run

    def timed_loop(scheduler: Scheduler) -> None:
        marks["start"] = time.perf_counter()
        loop(scheduler)
        marks["end"] = time.perf_counter()

    Scheduler.run = timed_loop  # type: ignore[method-assign]
    try:
        outcome = launcher.run()
    finally:
        Scheduler.run = loop  # type: ignore[method-assign]
    states = {t.state.name for t in outcome.study.trials}
    assert states == {"COMPLETE"} and len(outcome.study.trials) == jobs, states
    return marks["end"] - marks["start"]


def run_batch(root: Path, durations: list[float]) -> float:
    import optuna

    from paiexp.backends.local import LocalBackend
    from paiexp.config.schema import LocalBackendConfig
    from paiexp.config.spec import JobSpec
    from paiexp.metrics.extraction import MetricDefinition

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = LocalBackend(LocalBackendConfig(root=str(root / "batch-jobs")), root)
    backend.set_concurrency(SLOTS)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for duration in durations:
        study.enqueue_trial({"duration": duration})
    space = {"duration": optuna.distributions.FloatDistribution(0.2, 2.0)}
    definition = MetricDefinition("score", r"score=([0-9.]+)")
    started = time.perf_counter()
    for batch in range(0, len(durations), SLOTS):
        trials = [study.ask(space) for _ in range(min(SLOTS, len(durations) - batch))]
        handles = [
            backend.submit(
                JobSpec(
                    name=f"batch-{batch + i}",
                    command=JOB["command"],
                    hyperparameters={"duration": str(t.params["duration"])},
                    metric_definitions=(definition,),
                )
            )
            for i, t in enumerate(trials)
        ]
        while True:
            statuses = backend.poll(handles)
            if all(s.state.terminal for s in statuses.values()):
                break
            backend.wait(handles, backend.poll_interval)
        for trial in trials:
            study.tell(trial, trial.params["duration"])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=24)
    args = parse_args(parser, jobs=4)
    rng = random.Random(args.seed)
    durations = [round(rng.uniform(0.2, 2.0), 3) for _ in range(args.jobs)]
    total = sum(durations)

    workdir = Path(tempfile.mkdtemp(prefix="paiexp-async-"))
    make_project(workdir, durations)
    os.chdir(workdir)
    os.environ.pop("MLFLOW_TRACKING_URI", None)

    ideal = total / (SLOTS * ideal_makespan(durations))
    paiexp_makespan = run_paiexp(workdir, args.jobs)
    batch_makespan = run_batch(workdir, durations)
    paiexp = total / (SLOTS * paiexp_makespan)
    batch = total / (SLOTS * batch_makespan)
    print(f"{args.jobs} sleep jobs, {total:.1f} s of sleep, parallelism {SLOTS}, seed {args.seed}")
    print(f"ideal greedy: makespan {ideal_makespan(durations):6.2f} s  utilization {ideal:.3f}")
    print(f"paiexp:       makespan {paiexp_makespan:6.2f} s  utilization {paiexp:.3f}")
    print(f"batch loop:   makespan {batch_makespan:6.2f} s  utilization {batch:.3f}")
    print(
        f"paiexp / ideal = {paiexp / ideal:.3f}  (goal >= 0.95: "
        f"{'met' if paiexp / ideal >= 0.95 else 'NOT met'})"
    )
    print(
        f"paiexp / batch = {paiexp / batch:.3f}  (goal >= 1.25: "
        f"{'met' if paiexp / batch >= 1.25 else 'NOT met'})"
    )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
