"""Where the sweep launcher's CPU goes: one scale.py sweep (backend=local) under cProfile.

Runs the same sweep as ``benchmarks/scale.py`` (sleep jobs, journal storage, ``./mlflow.db``)
in this process with the launcher's main thread profiled, then prints the launcher's CPU per
trial and the functions that took it (cumulative and own time, in ms per trial), and keeps the
raw profile for ``python -m pstats``.

    python benchmarks/profile_launcher.py [--trials 300] [--parallelism 64]
        [--min-duration 1] [--max-duration 3] [--sampler random] [--out launcher.prof]
    python benchmarks/profile_launcher.py --quick     # seconds: scale.py's quick sweep
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import shutil
import tempfile
import time
from pathlib import Path

from bench_harness import parse_args
from scale import QUICK_WORKLOAD, prepare_here, workload_options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_options(parser, trials=300, parallelism=64, min_duration=1, max_duration=3)
    parser.add_argument("--sampler", default="random")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--out", default="launcher.prof")
    args = parse_args(parser, **QUICK_WORKLOAD, top=5)
    out = Path(args.out).resolve()

    from paiexp.sweep.launcher import Launcher
    from paiexp.sweep.progress import Progress

    root = Path(tempfile.mkdtemp(prefix="paiexp-profile-"))
    prepared = prepare_here(root, args, args.sampler)

    profile = cProfile.Profile(time.thread_time)  # the main thread's CPU, not wall time
    before = resource.getrusage(resource.RUSAGE_SELF)
    profile.enable()
    Launcher(prepared, Progress(args.trials, prepared.objectives)).run()
    profile.disable()
    after = resource.getrusage(resource.RUSAGE_SELF)
    shutil.rmtree(root, ignore_errors=True)

    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(
        f"launcher CPU {1000 * cpu / args.trials:.2f} ms per trial "
        f"(user {1000 * (after.ru_utime - before.ru_utime) / args.trials:.2f}, "
        f"system {1000 * (after.ru_stime - before.ru_stime) / args.trials:.2f}; "
        "profiled, so inflated)"
    )
    profile.dump_stats(out)
    stats = pstats.Stats(str(out))
    print(f"\nms per trial, {args.trials} trials (raw profile: {out})")
    rows = []
    for (path, line, function), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).parent.name}/{Path(path).name}:{line}({function})"
        rows.append((cumulative, own, calls, where))
    for title, key in (("cumulative", 0), ("own", 1)):
        print(f"\nby {title} time:   cum ms   own ms   calls/trial")
        for row in sorted(rows, key=lambda r: -r[key])[: args.top]:
            cumulative, own, calls, where = row
            print(
                f"  {1000 * cumulative / args.trials:8.3f} {1000 * own / args.trials:8.3f} "
                f"{calls / args.trials:8.1f}  {where}"
            )


if __name__ == "__main__":
    main()
