"""A whole sweep through paiexp against a bare loop over the same parameter sets.

`python -m paiexp +sweep=xgb` runs 20 XGBoost trials at parallelism 1 (pruning off, so every
trial trains fully), timed from the command's start to its exit: Python and library start-up,
Optuna, the local backend, MLflow tracking and the end-of-sweep plots all included. A bare
loop runs `python train.py ARGS` for the same 20 parameter sets, one after another, with the
same environment.

A shared machine's speed drifts by 10-20 % within minutes, so the two sides are measured in
the order sweep, bare, bare, sweep and compared as sums: a linear drift cancels. Each sweep
runs as the first one on a fresh machine would, in a new project with an empty paiexp and
matplotlib cache (`XDG_CACHE_HOME`): the MLflow schema and font cache are built within it.
The seeded sampler proposes the same points both times (the training is deterministic).
Prints every leg and the ratio of the sums. Goal: <= 1.15.

    python benchmarks/sweep_overhead.py [--trials 20]
    python benchmarks/sweep_overhead.py --quick   # seconds: 1 trial
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_harness import REPO, parse_args

GOAL = 1.15


def run_sweep(workdir: Path, trials: int, env: dict[str, str]) -> tuple[float, list[list[str]]]:
    """Seconds of one sweep command in a fresh project and cache; each trial's arguments."""
    project = Path(tempfile.mkdtemp(prefix="sweep-", dir=workdir))
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, project / name, symlinks=False)
    cache = project / ".fresh-cache"
    command = [
        sys.executable,
        "-m",
        "paiexp",
        "+sweep=xgb",
        f"sweep.n_trials={trials}",
        "sweep.parallelism=1",
        "sweep.pruner.name=none",
    ]
    started = time.perf_counter()
    subprocess.run(
        command,
        cwd=project,
        env={**env, "XDG_CACHE_HOME": str(cache)},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    jobs = sorted(p for p in (project / ".paiexp" / "jobs").iterdir() if not p.name.startswith("."))
    assert len(jobs) == trials, f"expected {trials} jobs, found {len(jobs)}"
    arguments = []
    for job_dir in jobs:
        hyperparameters = json.loads((job_dir / "spec.json").read_text())["hyperparameters"]
        arguments.append([item for n, v in hyperparameters.items() for item in (f"--{n}", v)])
    return seconds, arguments


def run_bare(workdir: Path, arguments: list[list[str]], env: dict[str, str]) -> float:
    """Seconds of ``python train.py ARGS`` for each parameter set, one after another."""
    example = workdir / "bare" / "xgb"
    if not example.exists():
        shutil.copytree(REPO / "examples" / "xgb", example)
    model_dir = Path(tempfile.mkdtemp(prefix="bare-model-", dir=workdir))
    bare_env = {
        **env,
        "PAI_INPUT_TRAIN": str(example / "data" / "train.csv"),
        "PAI_INPUT_TEST": str(example / "data" / "test.csv"),
        "PAI_OUTPUT_MODEL": str(model_dir),
    }
    seconds = 0.0
    for args in arguments:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "train.py", *args],
            cwd=example,
            env=bare_env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        seconds += time.perf_counter() - started
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parse_args(parser, trials=1)

    workdir = Path(tempfile.mkdtemp(prefix="paiexp-sweep-overhead-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    first, arguments = run_sweep(workdir, args.trials, env)
    bare = [run_bare(workdir, arguments, env), run_bare(workdir, arguments, env)]
    second, again = run_sweep(workdir, args.trials, env)
    assert again == arguments, "the seeded sweep proposed other points the second time"
    sweeps = first + second
    ratio = sweeps / sum(bare)
    print(f"trials:                       {args.trials} at parallelism 1, pruning off")
    print(f"paiexp sweep (whole command): {first:7.2f} s, {second:7.2f} s (fresh cache each)")
    print(f"bare loop of train.py:        {bare[0]:7.2f} s, {bare[1]:7.2f} s")
    print(f"overhead per trial:           {(sweeps - sum(bare)) / (2 * args.trials):+.3f} s")
    print(
        f"ratio paiexp / bare:          {ratio:.3f}  (sums, order sweep-bare-bare-sweep; "
        f"goal <= {GOAL:.2f}: {'met' if ratio <= GOAL else 'NOT met'})"
    )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
