"""What a second instance costs a local sweep: the same sweep of short jobs with
``job.instance_count=1`` and ``=2``.

Each leg is ``python -m paiexp +sweep=bench`` in a fresh project: N trials at parallelism 2
of a job that starts Python, reads its distributed variables and prints its score (the
instances of a 2-instance job do the same, so the difference is what paiexp spends on the
second instance: its runner, its ``/ml``, its warm start, its log). Timed from the command's
start to its exit (MLflow tracking and the end-of-sweep plots included). A shared machine
drifts, so the legs run in the order 1, 2, 2, 1 (``--order``) and are compared as sums (per
leg, should one run more often).

    python benchmarks/multi_instance.py [--trials 20] [--order 1 2 2 1]
    python benchmarks/multi_instance.py --quick   # seconds: 1 trial a leg, legs 1 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_harness import parse_args
from bench_project import write_project

JOB_SCRIPT = """\
import os
rank = int(os.environ.get("RANK", "0"))
x = float(os.environ["PAI_HPS_X"])
print(f"rank {rank} of {os.environ.get('WORLD_SIZE', '1')}")
print(f"score={x * x}")
"""


def project(root: Path, instances: int, trials: int) -> Path:
    code = root / "code"
    code.mkdir(parents=True)
    (code / "job.py").write_text(JOB_SCRIPT)
    job = {
        "name": "bench",
        "command": "python job.py",
        "source_dir": str(code),
        "instance_count": instances,
        "hyperparameters": {"x": 0.5},
        "metric_definitions": [{"name": "score", "regex": r"score=([0-9.eE+-]+)"}],
    }
    sweep = {
        "objective": {"metric": "score", "direction": "minimize"},
        "params": {"x": "interval(-1, 1)"},
        "n_trials": trials,
        "parallelism": 2,
        "sampler": {"name": "random", "seed": 1},
    }
    return write_project(root, job, "bench", sweep)


def leg(workdir: Path, instances: int, trials: int, env: dict[str, str]) -> float:
    root = project(Path(tempfile.mkdtemp(prefix=f"x{instances}-", dir=workdir)), instances, trials)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "paiexp", "+sweep=bench"],
        cwd=root,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--order", type=int, nargs="+", choices=(1, 2), default=[1, 2, 2, 1])
    args = parse_args(parser, trials=1, order=[1, 2])
    if set(args.order) != {1, 2}:
        parser.error("--order names both 1 and 2: their legs are compared")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    with tempfile.TemporaryDirectory(prefix="paiexp-multi-instance-") as directory:
        workdir = Path(directory)
        seconds = {1: 0.0, 2: 0.0}
        for instances in args.order:
            took = leg(workdir, instances, args.trials, env)
            seconds[instances] += took
            print(f"{instances} instance(s): {took:6.2f} s for {args.trials} trials")
    one, two = (seconds[n] / (args.order.count(n) * args.trials) for n in (1, 2))
    print(f"per trial:   1 instance {one:.3f} s, 2 instances {two:.3f} s")
    print(f"the second instance: {two - one:+.3f} s per trial; ratio 2 / 1: {two / one:.2f}")


if __name__ == "__main__":
    main()
