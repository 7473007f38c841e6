"""Start-up of a 2-instance docker job against a 1-instance job (goal: at most +0.5 s).

In one process, a no-op job (it prints the time its command started, then the metric, and
ends) runs N times as 1 instance and N times as 2 instances through paiexp's docker backend,
interleaved so both see the same machine load. Two figures per run: the start-up (from the
submission's start to the last instance's command starting: the job's network, every
container created and started) and the whole path of a trial (record, create the MLflow run,
submit, follow the log, extract metrics, close the run; for 2 instances also the second
container's collection and removal, and the network's). Prints the medians, their
differences and ratios.

    bash tests/images/build.sh && python benchmarks/docker_instances.py [--repeats 10]
    python benchmarks/docker_instances.py --quick     # seconds: once
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

SHAPES = {"1 instance": ["job.instance_count=1"], "2 instances": ["job.instance_count=2"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--image", default=docker_image_tag(), help="default: the test image")
    args = parse_args(parser, repeats=1)

    workdir = Path(tempfile.mkdtemp(prefix="paiexp-docker-instances-"))
    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, workdir / name)
    os.chdir(workdir)
    os.environ.pop("MLFLOW_TRACKING_URI", None)

    from paiexp.backends.base import JobState
    from paiexp.config.compose import locate_project
    from paiexp.errors import UserError
    from paiexp.runs import PreparedJob, execute, open_tracker, prepare, unique_job_name

    project = locate_project()
    command = "job.command='echo started=$(date +%s.%N); echo test-auc=1'"
    common = ["backend=docker", f"backend.image={args.image}", command]
    try:
        prepared = {shape: prepare(project, [*common, *extra]) for shape, extra in SHAPES.items()}
    except UserError as exc:
        sys.exit(f"docker_instances: {exc}")
    tracker = open_tracker(next(iter(prepared.values())).config)

    def run(shape: str) -> tuple[float, float]:
        composed: PreparedJob = prepared[shape]
        name = unique_job_name(composed.config.job.name)
        job = dataclasses.replace(composed, spec=dataclasses.replace(composed.spec, name=name))
        submitted, started = time.time(), time.perf_counter()
        _, result = execute(job, tracker, echo=None)
        whole = time.perf_counter() - started
        assert result.status.state is JobState.SUCCEEDED, result.status
        job_dir = job.backend.job_dir(name)
        logs = [job_dir / "paiexp" / "job.log", *job_dir.glob("instances/*/paiexp/job.log")]
        commands = [float(log.read_text().split("started=")[1].split()[0]) for log in logs]
        assert len(commands) == job.spec.instance_count, logs
        return max(commands) - submitted, whole

    for shape in prepared:  # warm-up: imports, page cache, MLflow schema
        run(shape)
    times: dict[str, list[tuple[float, float]]] = {shape: [] for shape in prepared}
    for _ in range(args.repeats):
        for shape in prepared:
            times[shape].append(run(shape))

    print(f"runs per shape: {args.repeats} (interleaved); no-op job; image {args.image}")
    for index, figure in enumerate(("start-up", "whole trial")):
        one, two = (statistics.median(t[index] for t in times[shape]) for shape in SHAPES)
        print(f"  {figure:11s}  1 instance {one:.3f} s, 2 instances {two:.3f} s median: ", end="")
        goal = " (goal <= +0.5 s)" if index == 0 else ""
        print(f"{two - one:+.3f} s{goal}, ratio 2 / 1 {two / one:.2f}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
