"""Per-trial overhead of backend=docker against backend=local, for the same short jobs.

In one process, each job runs N times through paiexp's docker backend and N times through
its local backend, interleaved so both see the same machine load; each run is the whole
path of a trial (record, create the MLflow run, submit, follow the log, extract metrics,
close the run). Two jobs: the XGBoost example with 20 boosting rounds, and a no-op shell
command that prints the metric (the backends' fixed cost alone: for docker, create, start,
requirements check, collect, remove). Prints the medians, their ratio and difference.
The XGBoost job runs in the test image (Debian's Python 3.11, XGBoost 1.7, pandas 1.5)
under docker and in this interpreter locally, so part of its difference is the libraries'.

    bash tests/images/build.sh && python benchmarks/docker_overhead.py [--repeats 10]
    python benchmarks/docker_overhead.py --quick      # seconds: once
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_harness import REPO, docker_image_tag, parse_args

JOBS = {
    "xgb example, 20 rounds": ["job.hyperparameters.n_estimators=20"],
    "no-op shell command": ["job.command='echo test-auc=1'"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--image", default=docker_image_tag(), help="default: the test image")
    args = parse_args(parser, repeats=1)

    workdir = Path(tempfile.mkdtemp(prefix="paiexp-docker-overhead-"))
    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, workdir / name)
    os.chdir(workdir)
    os.environ.pop("MLFLOW_TRACKING_URI", None)

    from paiexp.backends.base import JobState
    from paiexp.config.compose import locate_project
    from paiexp.errors import UserError
    from paiexp.runs import PreparedJob, execute, open_tracker, prepare, unique_job_name

    project = locate_project()
    docker = ["backend=docker", f"backend.image={args.image}"]
    try:
        prepared = {
            (job, backend): prepare(project, [*overrides, *extra])
            for job, overrides in JOBS.items()
            for backend, extra in (("local", []), ("docker", docker))
        }
    except UserError as exc:
        sys.exit(f"docker_overhead: {exc}")
    tracker = open_tracker(next(iter(prepared.values())).config)

    def run(key: tuple[str, str]) -> float:
        composed: PreparedJob = prepared[key]
        name = unique_job_name(composed.config.job.name)
        job = dataclasses.replace(composed, spec=dataclasses.replace(composed.spec, name=name))
        started = time.perf_counter()
        _, result = execute(job, tracker, echo=None)
        assert result.status.state is JobState.SUCCEEDED, result.status
        return time.perf_counter() - started

    for key in prepared:  # warm-up: imports, page cache, MLflow schema, image layers
        run(key)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in prepared}
    for _ in range(args.repeats):
        for key in prepared:
            times[key].append(run(key))

    print(f"runs per side: {args.repeats} (interleaved); image {args.image}")
    for job in JOBS:
        local = statistics.median(times[job, "local"])
        docker_median = statistics.median(times[job, "docker"])
        print(f"{job}:")
        print(f"  backend=local  median {local:.3f} s per trial")
        print(f"  backend=docker median {docker_median:.3f} s per trial")
        print(
            f"  docker - local {docker_median - local:+.3f} s; "
            f"ratio docker / local {docker_median / local:.3f}"
        )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
