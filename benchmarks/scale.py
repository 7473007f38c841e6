"""The launcher at a PAI quota's scale: 2,000 trials of 5-20 s sleep jobs at parallelism 128.

One sweep on backend=local per sampler (random, then TPE), each in a process of its own: every
trial samples an ``x`` (the job prints ``score=x``, minimized) and sleeps 5-20 s, a duration
spread evenly by a hash of ``x`` (so that neither sampler changes the workload: TPE would
favour the durations of the trials that finish first), with the default journal storage and
``./mlflow.db``.  Measured in this one run, per sampler:

- slot utilization = sum(durations) / (parallelism x makespan), from the loop's start to its
  last trial told, against the ideal: a zero-overhead greedy schedule of the same durations
  in trial order;
- launcher CPU seconds per trial (the launcher's process, user + system, whole launch);
- sampling time per trial (``Study.ask``, in the launcher's loop);
- peak RSS of the launcher and of its tracking process (VmHWM);
- tracking writes per trial: the MLflow store's write transactions (SQLite's file change
  counter), and the tracking process's CPU seconds per trial.

Goals: utilization >= 0.90 x ideal; <= 5 ms launcher CPU per trial (random sampler: TPE's own
cost is the sampling time); <= 400 MB RSS each; TPE's utilization / ideal no more than 0.03
below random's (sampling does not starve the loop that follows the jobs).

    python benchmarks/scale.py [--trials 2000] [--parallelism 128] [--samplers random tpe]
    python benchmarks/scale.py --trials 200 --parallelism 32     # a shorter check
    python benchmarks/scale.py --quick    # seconds: 4 trials of 0.1-0.3 s at 2
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_harness import parse_args
from bench_project import write_project

if TYPE_CHECKING:
    from paiexp.sweep.prepared import PreparedSweep

GOALS = {"utilization": 0.90, "cpu_ms": 5.0, "rss_mb": 400.0, "tpe_cost": 0.03}
# --quick: the smallest sweep, for every benchmark that runs it.
QUICK_WORKLOAD = {"trials": 4, "parallelism": 2, "min_duration": 0.1, "max_duration": 0.3}
# The sleep: lo + (hi - lo) * frac(x * 1000003), to the millisecond (see sleep_of).
SLEEP = (
    'awk -v x="$PAI_HPS_X" -v lo="$PAI_HPS_LO" -v hi="$PAI_HPS_HI" '
    "'BEGIN { f = x * 1000003; f -= int(f); if (f < 0) f += 1; "
    'printf "%.3f", lo + (hi - lo) * f }\''
)
JOB = {
    "name": "sleeper",
    "command": f"sleep $({SLEEP}); echo score=$PAI_HPS_X",
    "hyperparameters": {"x": 0.0},
    "metric_definitions": [{"name": "score", "regex": r"score=([-+0-9.eE]+)"}],
}


def make_project(root: Path, args: argparse.Namespace, sampler: str) -> None:
    job = {**JOB, "hyperparameters": {"x": 0.0, "lo": args.min_duration, "hi": args.max_duration}}
    sweep = {
        "objective": {"metric": "score", "direction": "minimize"},
        "params": {"x": "interval(-1, 1)"},
        "n_trials": args.trials,
        "parallelism": args.parallelism,
        "sampler": {"name": sampler, "seed": args.seed},
    }
    write_project(root, job, "scale", sweep)


def workload_options(
    parser: argparse.ArgumentParser,
    *,
    trials: int,
    parallelism: int,
    min_duration: float,
    max_duration: float,
) -> None:
    """The options of the sweep this benchmark runs, for every benchmark that runs it."""
    parser.add_argument("--trials", type=int, default=trials)
    parser.add_argument("--parallelism", type=int, default=parallelism)
    parser.add_argument("--min-duration", type=float, default=min_duration)
    parser.add_argument("--max-duration", type=float, default=max_duration)
    parser.add_argument("--seed", type=int, default=0)


def prepare_here(root: Path, args: argparse.Namespace, sampler: str) -> PreparedSweep:
    """The sweep's project made in ``root``, made the working directory, and the sweep
    prepared as ``python -m paiexp +sweep=scale`` would (tracked in ``./mlflow.db``)."""
    from paiexp.config.compose import compose, locate_project, to_object
    from paiexp.sweep.prepared import prepare_sweep

    make_project(root, args, sampler)
    os.chdir(root)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    project = locate_project(str(root / "conf"))
    cfg = compose(project, ["+sweep=scale"])
    return prepare_sweep(cfg, to_object(cfg), project.base_dir, ("+sweep=scale",))


def sleep_of(x: float, lo: float, hi: float) -> float:
    """The seconds a job sleeps for ``x``: what its awk prints."""
    f = x * 1000003
    f -= math.trunc(f)
    f += 1 if f < 0 else 0
    return round(lo + (hi - lo) * f, 3)


def ideal_makespan(durations: list[float], slots: int) -> float:
    """Greedy list scheduling with no overhead: each job starts when a slot frees."""
    ends = [0.0] * slots
    for duration in durations:
        heapq.heappush(ends, heapq.heappop(ends) + duration)
    return max(ends)


def proc_status(pid: int, field: str) -> float:
    """A ``/proc/PID/status`` figure in kB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def change_counter(store: Path) -> int | None:
    """SQLite's file change counter: one more per write transaction (rollback journal)."""
    try:
        with open(store, "rb") as stream:
            header = stream.read(28)
    except OSError:
        return None
    return int.from_bytes(header[24:28], "big") if len(header) == 28 else None


class TrackerWatch(threading.Thread):
    """Samples the tracking process (peak RSS, CPU) and the MLflow store's first counter."""

    def __init__(self, store: Path) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.pid: int | None = None
        self.peak_kb = 0.0
        self.cpu = 0.0
        self.first_counter: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            if self.pid is None:
                self.pid = tracking_process()
            if self.pid is not None:
                self.peak_kb = max(self.peak_kb, proc_status(self.pid, "VmHWM"))
                self.cpu = max(self.cpu, proc_cpu(self.pid))
            if self.first_counter is None:
                self.first_counter = change_counter(self.store)


def tracking_process() -> int | None:
    """The launcher's tracking process: its child started by multiprocessing's spawn."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == me and b"spawn_main" in command:
            return int(entry.name)
    return None


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One sweep in this process (``--child``); its figures."""
    import optuna

    from paiexp.sweep.launcher import Launcher
    from paiexp.sweep.progress import Progress
    from paiexp.sweep.scheduler import Scheduler

    root = Path(args.workdir)
    prepared = prepare_here(root, args, args.child)

    marks: dict[str, float] = {}
    asks: list[float] = []
    loop, ask = Scheduler.run, optuna.Study.ask

    def timed_loop(scheduler: Scheduler) -> None:
        marks["start"] = time.perf_counter()
        loop(scheduler)
        marks["end"] = time.perf_counter()

    def timed_ask(study: optuna.Study, *a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return ask(study, *a, **k)
        finally:
            asks.append(time.perf_counter() - started)

    Scheduler.run = timed_loop  # type: ignore[method-assign]
    optuna.Study.ask = timed_ask  # type: ignore[method-assign]
    watch = TrackerWatch(root / "mlflow.db")
    watch.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    outcome = Launcher(prepared, Progress(args.trials, prepared.objectives)).run()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    watch.done.set()
    watch.join()

    trials = sorted(outcome.study.trials, key=lambda t: t.number)
    states = {t.state.name for t in trials}
    assert states == {"COMPLETE"} and len(trials) == args.trials, states
    durations = [sleep_of(t.params["x"], args.min_duration, args.max_duration) for t in trials]
    makespan = marks["end"] - marks["start"]
    ideal = ideal_makespan(durations, args.parallelism)
    total = sum(durations)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    end_counter = change_counter(root / "mlflow.db") or 0
    return {
        "sampler": args.child,
        "makespan": makespan,
        "ideal_makespan": ideal,
        "utilization": total / (args.parallelism * makespan),
        "ideal_utilization": total / (args.parallelism * ideal),
        "drain": wall - (marks["end"] - started),  # launch end after the last trial told
        "launcher_cpu_ms": 1000 * cpu / args.trials,
        "ask_ms": 1000 * sum(asks) / len(asks),
        "ask_max_ms": 1000 * max(asks),
        "launcher_rss_mb": proc_status(os.getpid(), "VmHWM") / 1024,
        "tracker_rss_mb": watch.peak_kb / 1024,
        "tracker_cpu_ms": 1000 * watch.cpu / args.trials,
        "writes": (end_counter - (watch.first_counter or 0)) / args.trials,
    }


def report(figures: dict[str, Any], parallelism: int) -> float:
    """Print one sampler's figures; returns its utilization / ideal."""
    ratio = figures["utilization"] / figures["ideal_utilization"]
    print(f"\n{figures['sampler']} sampler")
    print(
        f"  makespan {figures['makespan']:7.1f} s (ideal {figures['ideal_makespan']:.1f} s); "
        f"utilization {figures['utilization']:.3f} of {parallelism} slots, "
        f"ideal {figures['ideal_utilization']:.3f}"
    )
    print(f"  utilization / ideal = {ratio:.3f}  {goal(ratio >= GOALS['utilization'], '>= 0.90')}")
    cpu = figures["launcher_cpu_ms"]
    verdict = (  # the goal is the random sampler's: TPE's own cost is its sampling time
        goal(cpu <= GOALS["cpu_ms"], "<= 5 ms")
        if figures["sampler"] == "random"
        else "(the 5 ms goal is the random sampler's)"
    )
    print(
        f"  launcher CPU {cpu:.2f} ms per trial  {verdict}; "
        f"sampling {figures['ask_ms']:.2f} ms per trial (max {figures['ask_max_ms']:.1f} ms)"
    )
    for who in ("launcher", "tracker"):
        rss = figures[f"{who}_rss_mb"]
        print(f"  peak RSS {who:<8} {rss:6.0f} MB  {goal(rss <= GOALS['rss_mb'], '<= 400 MB')}")
    print(
        f"  tracking: {figures['writes']:.2f} store writes and "
        f"{figures['tracker_cpu_ms']:.1f} ms CPU per trial; "
        f"done {figures['drain']:.1f} s after the last trial was told"
    )
    return ratio


def goal(met: bool, text: str) -> str:
    return f"(goal {text}: {'met' if met else 'NOT met'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, trials=2000, parallelism=128, min_duration=5, max_duration=20)
    parser.add_argument("--samplers", nargs="+", default=["random", "tpe"])
    parser.add_argument("--child", help=argparse.SUPPRESS)  # run one sampler's sweep here
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parse_args(parser, **QUICK_WORKLOAD)
    if args.child:
        print(json.dumps(run_one(args)))
        return

    print(
        f"{args.trials} trials of {args.min_duration:g}-{args.max_duration:g} s sleep jobs at "
        f"parallelism {args.parallelism}, backend=local, journal storage, ./mlflow.db"
    )
    ratios = {}
    for sampler in args.samplers:
        workdir = Path(tempfile.mkdtemp(prefix=f"paiexp-scale-{sampler}-"))
        settings = {
            "--trials": args.trials,
            "--parallelism": args.parallelism,
            "--min-duration": args.min_duration,
            "--max-duration": args.max_duration,
            "--seed": args.seed,
            "--child": sampler,
            "--workdir": workdir,
        }
        done = subprocess.run(
            [sys.executable, __file__, *(str(a) for item in settings.items() for a in item)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the launcher's progress lines
            text=True,
            check=True,
        )
        ratios[sampler] = report(json.loads(done.stdout.splitlines()[-1]), args.parallelism)
        shutil.rmtree(workdir, ignore_errors=True)
    if "random" in ratios and "tpe" in ratios:
        cost = ratios["random"] - ratios["tpe"]
        print(
            f"\nTPE's cost in utilization / ideal: {cost:+.3f}  "
            f"{goal(cost <= GOALS['tpe_cost'], '<= 0.03')}"
        )


if __name__ == "__main__":
    main()
