"""OpenPAI status requests per polling tick, and submissions per trial, at parallelism 1, 4, 16.

Runs a sweep with ``backend=openpai`` against the fake OpenPAI cluster of the tests
(tests/openpai_server: the rest-server over real HTTP, each job a container of the test image)
at each parallelism, ``--per-slot`` trials per slot, each trial the tests' synthetic job
sleeping ``--duration`` seconds. The launcher runs with its backend's ``poll`` counted (one
call is one tick of its loop); the cluster counts every request it received.

Status requests are the job listings and job details (``GET /api/v2/jobs``,
``GET /api/v2/jobs/{user}~{name}``); the goal is 1 per tick whatever the parallelism.
openpaisdk's way, ``ClusterClient.wait(jobs)``, asks for each job in turn: one request per
job in flight per tick. Submissions are the ``POST /api/v2/jobs`` sent (goal: 1 per trial)
and the jobs the cluster created (exactly 1 per trial).

    python benchmarks/openpai_api_calls.py [--parallelism 1 4 16] [--per-slot 2] [--duration 3]
    python benchmarks/openpai_api_calls.py --quick    # seconds: 2 trials at parallelism 2
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

from bench_harness import REPO, docker_image_tag, parse_args
from bench_project import write_project

POLL_INTERVAL = 0.5
STORAGE = "confignfs"
# The launcher, its backend's poll() counted: one call per tick of the scheduling loop.
COUNTING_LAUNCHER = """
import json, sys
from paiexp.backends import openpai
from paiexp.cli import main

ticks = 0
poll = openpai.OpenPaiBackend.poll

def counted(self, handles):
    global ticks
    ticks += 1
    return poll(self, handles)

openpai.OpenPaiBackend.poll = counted
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as stream:
    json.dump({"ticks": ticks}, stream)
sys.exit(code)
"""


def project(root: Path, trials: int, parallelism: int, duration: float) -> Path:
    shutil.copytree(REPO / "tests" / "synthetic", root / "code")
    job = {
        "name": "bench",
        "command": "python job.py",
        "source_dir": "code",
        "hyperparameters": {"x": 0.0, "duration": duration, "steps": 5},
        "metric_definitions": [{"name": "score", "regex": r"score=([-+0-9.eE]+)"}],
    }
    sweep = {
        "objective": {"metric": "score", "direction": "minimize"},
        "params": {"x": "interval(-1, 1)"},
        "n_trials": trials,
        "parallelism": parallelism,
        "sampler": {"name": "random", "seed": 0},
    }
    return write_project(root, job, "bench", sweep)


def measure(
    workdir: Path, image: str, parallelism: int, per_slot: int, duration: float
) -> dict[str, float]:
    from openpai_server import OpenPaiServer  # tests/, on the path through bench_harness

    trials = parallelism * per_slot
    root = project(workdir / f"p{parallelism}", trials, parallelism, duration)
    with OpenPaiServer(workdir / f"cluster-p{parallelism}") as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["OPENPAI_TOKEN"] = server.token
        counts = root / "ticks.json"
        command = [
            sys.executable,
            "-c",
            COUNTING_LAUNCHER,
            str(counts),
            "+sweep=bench",
            "backend=openpai",
            f"backend.rest_server_uri={server.rest_server_uri}",
            f"backend.user={server.user}",
            f"backend.storage.name={STORAGE}",
            f"backend.storage.local_path={server.storage_dir(STORAGE)}",
            f"backend.image={image}",
            "job.instance_type=ecs.c6.large",
            "backend.cpus=1",
            f"backend.poll_interval={POLL_INTERVAL}",
            "backend.log_interval=2",
        ]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"the sweep at parallelism {parallelism} failed:\n{done.stderr[-3000:]}")
        ticks = json.loads(counts.read_text())["ticks"]
        status = len(server.records("ListJobs")) + len(server.records("GetJob"))
        created = sum(server.submissions.values())
        assert created == trials and set(server.submissions.values()) == {1}, server.submissions
        assert server.containers() == [], "containers left"
        return {
            "trials": trials,
            "wall": wall,
            "ticks": ticks,
            "status": status,
            "posts": len(server.records("SubmitJob")),
            "created": created,
            "requests": len(server.records()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallelism", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--per-slot", type=int, default=2, help="trials per parallel slot")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds each job works")
    args = parse_args(parser, parallelism=[2], per_slot=1, duration=0.5)

    image = docker_image_tag()
    workdir = Path(tempfile.mkdtemp(prefix="paiexp-openpai-calls-"))
    print(
        f"{'parallelism':>11} {'trials':>6} {'sweep s':>8} {'ticks':>6} {'status req':>10} "
        f"{'per tick':>8} {'sdk/tick':>8} {'POST/trial':>10} {'jobs/trial':>10} {'req/trial':>9}"
    )
    for parallelism in args.parallelism:
        m = measure(workdir, image, parallelism, args.per_slot, args.duration)
        n = m["trials"]
        print(
            f"{parallelism:>11} {n:>6} {m['wall']:>8.1f} {m['ticks']:>6} {m['status']:>10} "
            f"{m['status'] / m['ticks']:>8.2f} {parallelism:>8} {m['posts'] / n:>10.2f} "
            f"{m['created'] / n:>10.2f} {m['requests'] / n:>9.1f}"
        )
    print(
        "status req: job listings and details; sdk/tick: openpaisdk's wait(), one request per "
        "job in flight; req/trial: every request, logs and checks included"
    )
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
