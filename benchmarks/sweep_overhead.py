"""A whole sweep through paiexp against a bare loop over the same parameter sets.

`python -m paiexp +sweep=xgb` runs 20 XGBoost trials at parallelism 1 (pruning off, so every
trial trains fully), timed from the command's start to its exit: Python and library start-up,
Optuna, the local backend, MLflow tracking and the end-of-sweep plots all included. Then a
bare loop runs `python train.py ARGS` for the same 20 parameter sets, one after another, with
the same environment. Prints both and their ratio. Goal: <= 1.15.

    python benchmarks/sweep_overhead.py [--trials 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL = 1.15


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="paiexp-sweep-overhead-"))
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, workdir / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}

    command = [
        sys.executable,
        "-m",
        "paiexp",
        "+sweep=xgb",
        f"sweep.n_trials={args.trials}",
        "sweep.parallelism=1",
        "sweep.pruner.name=none",
    ]
    started = time.perf_counter()
    subprocess.run(
        command,
        cwd=workdir,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    paiexp_seconds = time.perf_counter() - started

    jobs = sorted(p for p in (workdir / ".paiexp" / "jobs").iterdir() if not p.name.startswith("."))
    assert len(jobs) == args.trials, f"expected {args.trials} jobs, found {len(jobs)}"
    bare_seconds = 0.0
    model_dir = workdir / "bare-model"
    model_dir.mkdir()
    data = workdir / "examples" / "xgb" / "data"
    for job_dir in jobs:
        spec = json.loads((job_dir / "spec.json").read_text())
        arguments = [
            item for name, value in spec["hyperparameters"].items() for item in (f"--{name}", value)
        ]
        bare_env = {
            **env,
            "PAI_INPUT_TRAIN": str(data / "train.csv"),
            "PAI_INPUT_TEST": str(data / "test.csv"),
            "PAI_OUTPUT_MODEL": str(model_dir),
        }
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "train.py", *arguments],
            cwd=workdir / "examples" / "xgb",
            env=bare_env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        bare_seconds += time.perf_counter() - started

    ratio = paiexp_seconds / bare_seconds
    print(f"trials:                       {args.trials} at parallelism 1, pruning off")
    print(f"paiexp sweep (whole command): {paiexp_seconds:7.2f} s")
    print(f"bare loop of train.py:        {bare_seconds:7.2f} s")
    print(f"overhead per trial:           {(paiexp_seconds - bare_seconds) / args.trials:+.3f} s")
    print(
        f"ratio paiexp / bare:          {ratio:.3f}  (goal <= {GOAL:.2f}: "
        f"{'met' if ratio <= GOAL else 'NOT met'})"
    )
    print(f"example bare command:         python train.py {shlex.join(arguments)}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
