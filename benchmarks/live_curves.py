"""Curves while trials run: the points a running job's MLflow run holds partway through.

A sweep of two trials at parallelism 2, and a single run, of a job that prints one loss point a
second for 40 s (the tests' synthetic job), on the local backend, docker (the test image CI
builds) and the PAI emulator (tests/emulator: real HTTP, the official clients, paiexp's default
poll and log intervals). 25 s after each command started, the benchmark reads the project's
MLflow store: the loss points in every RUNNING run (a sweep's child runs; the single run), and
the points the job had printed by then. Goal: >= 10 points in each running run. Before live
curves, a sweep's child runs held none until their job ended.

    python benchmarks/live_curves.py [--seconds 40] [--at 25] [--backends local,docker,pai]
    python benchmarks/live_curves.py --quick    # seconds: local only, 4-s jobs read at 3 s
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from bench_harness import REPO, docker_image_tag, parse_args
from bench_project import write_project

GOAL = 10


def project(root: Path, seconds: float) -> Path:
    """The synthetic job printing ``loss=...`` once a second for ``seconds``; a 2-trial sweep."""
    shutil.copytree(REPO / "tests" / "synthetic", root / "code")
    job = {
        "name": "live",
        "command": "python job.py",
        "source_dir": "code",
        "instance_type": "ecs.c6.large",
        "hyperparameters": {"x": 0.5, "duration": seconds, "steps": int(seconds)},
        "metric_definitions": [
            {"name": "loss", "regex": r"loss=([-+0-9.eE]+)"},
            {"name": "score", "regex": r"score=([-+0-9.eE]+)"},
        ],
    }
    sweep = {
        "objective": {"metric": "score", "direction": "minimize"},
        "params": {"x": "interval(-1, 1)"},
        "n_trials": 2,
        "parallelism": 2,
        "sampler": {"name": "random", "seed": 0},
    }
    return write_project(root, job, "live", sweep)


@contextmanager
def backend(name: str, workdir: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The overrides and environment that run the project's jobs on ``name``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ALIBABA_"))}
    env["XDG_CACHE_HOME"] = str(workdir / "cache")
    if name == "local":
        yield [], env
    elif name == "docker":
        yield ["backend=docker", f"backend.image={docker_image_tag()}"], env
    elif name == "pai":
        from emulator import Emulator  # tests/, on the path through bench_harness

        with Emulator(workdir / "cloud") as cloud:
            env["ALIBABA_CLOUD_ACCESS_KEY_ID"] = cloud.credentials.access_key_id
            env["ALIBABA_CLOUD_ACCESS_KEY_SECRET"] = cloud.credentials.access_key_secret
            yield (
                [
                    "backend=pai",
                    f"backend.endpoint={cloud.pai_endpoint}",
                    "backend.protocol=http",
                    f"backend.workspace_id={cloud.workspace_id}",
                    f"backend.oss.bucket={cloud.bucket}",
                    f"backend.oss.endpoint={cloud.oss_endpoint}",
                    f"backend.image={cloud.default_image}",
                ],
                env,
            )
    else:
        sys.exit(f"--backends: unknown backend {name!r}; valid: local, docker, pai")


def running_points(root: Path) -> list[int]:
    """The number of loss points in each RUNNING run of a sweep's trials or a single run, read
    from the project's store read-only (MLflow's client would make its tables if they were not
    there yet: paiexp's to make)."""
    store = root / "mlflow.db"
    if not store.exists():
        return []
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)) as db:
        rows = db.execute(
            "SELECT (SELECT COUNT(*) FROM metrics m WHERE m.run_uuid = r.run_uuid AND m.key ="
            " 'loss') FROM runs r WHERE r.status = 'RUNNING' AND NOT EXISTS (SELECT 1 FROM tags t"
            " WHERE t.run_uuid = r.run_uuid AND t.key = 'paiexp.kind' AND t.value = 'sweep')"
        )
        return [count for (count,) in rows]


def measure(name: str, sweep: bool, args: argparse.Namespace, workdir: Path) -> list[int]:
    """Points in each running run ``args.at`` seconds after the command started."""
    leg = workdir / f"{name}-{'sweep' if sweep else 'single'}"
    root = project(leg, args.seconds)
    with backend(name, leg) as (overrides, env):
        command = [sys.executable, "-m", "paiexp", *(["+sweep=live"] if sweep else []), *overrides]
        started = time.monotonic()
        with open(leg / "paiexp.txt", "w") as said:
            launched = subprocess.Popen(command, cwd=root, env=env, stdout=said, stderr=said)
            try:
                time.sleep(max(0.0, started + args.at - time.monotonic()))
                counts = running_points(root) if launched.poll() is None else []
                code = launched.wait(timeout=args.seconds * 4 + 120)
            finally:
                launched.kill()
    if code != 0:
        sys.exit(f"{name}: paiexp exited {code}:\n{(leg / 'paiexp.txt').read_text()[-3000:]}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="each job's duration")
    parser.add_argument("--at", type=float, default=25.0, help="when MLflow is read")
    parser.add_argument("--backends", default="local,docker,pai")
    args = parse_args(parser, seconds=4.0, at=3.0, backends="local")

    workdir = Path(tempfile.mkdtemp(prefix="paiexp-live-"))
    print(f"jobs printing one loss point a second for {args.seconds:g} s, read at {args.at:g} s")
    fewest = []
    for name in args.backends.split(","):
        for sweep in (True, False):
            counts = measure(name, sweep, args, workdir)
            fewest.append(min(counts, default=0))
            what = "sweep, each running trial's run" if sweep else "single run"
            print(f"{name:8} {what:34} points: {counts}")
    shutil.rmtree(workdir, ignore_errors=True)
    least = min(fewest)
    print(f"fewest points in a running run: {least} (goal >= {GOAL}), / goal {least / GOAL:.2f}")


if __name__ == "__main__":
    main()
