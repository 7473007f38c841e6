"""Launch + tracking overhead of one paiexp run against a bare `python train.py`.

In one process, the XGBoost example runs N times through paiexp's backend and tracker
(record, create the MLflow run, submit to the local backend, follow the log, extract metrics,
close the run) and N times as a bare `python train.py ARGS` subprocess with the same
environment and working directory, interleaved so both see the same machine load. Prints the
median of each and their ratio (goal: <= 1.10), and separately the one-off cost per process
of composing the config with Hydra, which a sweep pays once for all its trials.

    python benchmarks/overhead.py [--repeats 10]
    python benchmarks/overhead.py --quick     # seconds: once
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_harness import REPO, parse_args

GOAL = 1.10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parse_args(parser, repeats=1)

    workdir = Path(tempfile.mkdtemp(prefix="paiexp-overhead-"))
    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, workdir / name)
    os.chdir(workdir)
    os.environ.pop("MLFLOW_TRACKING_URI", None)

    from paiexp.backends.base import JobState
    from paiexp.config.compose import locate_project
    from paiexp.runs import PreparedJob, execute, open_tracker, prepare, unique_job_name

    project = locate_project()

    started = time.perf_counter()
    composed = prepare(project, [])
    compose_seconds = time.perf_counter() - started
    tracker = open_tracker(composed.config)

    def through_paiexp() -> tuple[float, PreparedJob]:
        name = unique_job_name(composed.config.job.name)
        job = dataclasses.replace(composed, spec=dataclasses.replace(composed.spec, name=name))
        started = time.perf_counter()
        _, result = execute(job, tracker, echo=None)
        assert result.status.state is JobState.SUCCEEDED, result.status
        return time.perf_counter() - started, job

    _, first_job = through_paiexp()  # warm-up: imports, page cache, MLflow schema
    backend = first_job.backend
    job_dir = backend.job_dir(first_job.spec.name)
    env = backend._environment(first_job.spec, job_dir)
    usercode = job_dir / "ml" / "usercode"
    bare_command = [sys.executable, "train.py", *shlex.split(env["PAI_USER_ARGS"])]

    def bare() -> float:
        started = time.perf_counter()
        subprocess.run(
            bare_command,
            cwd=usercode,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - started

    bare()
    paiexp_times, bare_times = [], []
    for _ in range(args.repeats):
        paiexp_times.append(through_paiexp()[0])
        bare_times.append(bare())

    paiexp_median = statistics.median(paiexp_times)
    bare_median = statistics.median(bare_times)
    ratio = paiexp_median / bare_median
    print(f"runs per side:           {args.repeats} (interleaved)")
    print(f"bare python train.py:    median {bare_median:.3f} s")
    print(f"through paiexp + MLflow: median {paiexp_median:.3f} s")
    print(f"overhead per run:        {paiexp_median - bare_median:+.3f} s")
    print(
        f"ratio paiexp / bare:     {ratio:.3f}  (goal <= {GOAL:.2f}: "
        f"{'met' if ratio <= GOAL else 'NOT met'})"
    )
    print(
        f"once per process:        compose + validate {compose_seconds:.3f} s; with it in "
        f"every run the ratio would be {(paiexp_median + compose_seconds) / bare_median:.3f}"
    )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
