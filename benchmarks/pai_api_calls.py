"""PAI API requests and OSS upload volume per trial: paiexp's sweep against the PAI SDK's way.

Runs a 20-trial sweep at parallelism 5 with ``backend=pai`` against the local PAI + OSS emulator
(tests/emulator, real HTTP, the official clients): the synthetic job of the tests, each trial
lasting a random 20-60 s (seeded), with the XGBoost example's data as local inputs. Counts
every request the emulator received, retries included, and the bytes uploaded to OSS.

The PAI SDK's pattern, one ``Estimator.fit()`` per trial, is computed for the same jobs from
their recorded timelines: the code's files uploaded for every job, CreateTrainingJob, one
GetTrainingJob after creating, GetTrainingJob every 5 s until the job ends, and
ListTrainingJobLogs every 1 s while it runs (the SDK's log printer).

``--scale`` shrinks every duration and interval alike (default 0.25: jobs of 5-15 s, paiexp
polling every 2.5 s, the SDK pattern every 1.25 s and 0.25 s), which leaves the counts per
trial as they would be at full scale.

    python benchmarks/pai_api_calls.py [--trials 20] [--parallelism 5] [--scale 0.25]
    python benchmarks/pai_api_calls.py --quick    # seconds: 2 trials at 2, scale 0.02
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench_harness import REPO, parse_args
from bench_project import write_project

from paiexp.config.schema import PaiBackendConfig

SDK_STATUS_INTERVAL = 5.0  # pai.job.TrainingJob.wait: GetTrainingJob every 5 s
SDK_LOG_INTERVAL = 1.0  # its log printer: ListTrainingJobLogs every 1 s


def project(root: Path, trials: int, parallelism: int, scale: float) -> Path:
    # the code: the XGBoost example's directory (its data included) plus the synthetic job
    shutil.copytree(REPO / "examples" / "xgb", root / "code")
    shutil.copy2(REPO / "tests" / "synthetic" / "job.py", root / "code" / "job.py")
    data = REPO / "examples" / "xgb" / "data"
    job = {
        "name": "bench",
        "command": "python job.py",
        "source_dir": "code",
        "instance_type": "ecs.c6.large",
        "hyperparameters": {"x": 0.0, "duration": 1.0, "steps": 20},
        "inputs": {"train": str(data / "train.csv"), "test": str(data / "test.csv")},
        "metric_definitions": [
            {"name": "loss", "regex": r"loss=([-+0-9.eE]+)"},
            {"name": "score", "regex": r"score=([-+0-9.eE]+)"},
        ],
    }
    sweep = {
        "objective": {"metric": "score", "direction": "minimize"},
        "params": {"x": "interval(-1, 1)", "duration": f"interval({20 * scale}, {60 * scale})"},
        "n_trials": trials,
        "parallelism": parallelism,
        "sampler": {"name": "random", "seed": 0},
    }
    return write_project(root, job, "bench", sweep)


def seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def end_time(job: dict) -> float:
    return seconds(job["StatusTransitions"][-1]["StartTime"])


def sdk_requests(jobs: list[dict], scale: float) -> float:
    """PAI requests per trial of one Estimator.fit per trial, for these jobs' timelines."""
    status_every, logs_every = SDK_STATUS_INTERVAL * scale, SDK_LOG_INTERVAL * scale
    pai = 0
    for job in jobs:
        created, ended = seconds(job["GmtCreateTime"]), end_time(job)
        running = next(t for t in job["StatusTransitions"] if t["Status"] == "Running")
        run_time = ended - seconds(running["StartTime"])
        pai += 2  # CreateTrainingJob, then GetTrainingJob for the console URL
        pai += math.ceil((ended - created) / status_every)  # wait(): GetTrainingJob
        pai += math.ceil(run_time / logs_every)  # the log printer: ListTrainingJobLogs
    return pai / len(jobs)


def main() -> None:
    from emulator import Emulator  # tests/, on the path through bench_harness

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--parallelism", type=int, default=5)
    parser.add_argument("--scale", type=float, default=0.25)
    args = parse_args(parser, trials=2, parallelism=2, scale=0.02)

    defaults = PaiBackendConfig()  # paiexp's intervals, scaled
    workdir = Path(tempfile.mkdtemp(prefix="paiexp-pai-calls-"))
    root = project(workdir / "project", args.trials, args.parallelism, args.scale)
    with Emulator(workdir / "cloud") as cloud:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["ALIBABA_CLOUD_ACCESS_KEY_ID"] = cloud.credentials.access_key_id
        env["ALIBABA_CLOUD_ACCESS_KEY_SECRET"] = cloud.credentials.access_key_secret
        env["XDG_CACHE_HOME"] = str(workdir / "cache")
        command = [
            sys.executable,
            "-m",
            "paiexp",
            "+sweep=bench",
            "backend=pai",
            f"backend.endpoint={cloud.pai_endpoint}",
            "backend.protocol=http",
            f"backend.workspace_id={cloud.workspace_id}",
            f"backend.oss.bucket={cloud.bucket}",
            f"backend.oss.endpoint={cloud.oss_endpoint}",
            f"backend.image={cloud.default_image}",
            f"backend.poll_interval={defaults.poll_interval * args.scale}",
            f"backend.log_interval={defaults.log_interval * args.scale}",
        ]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the sweep failed:\n{done.stderr[-3000:]}")
        wall = time.perf_counter() - started
        jobs = cloud.jobs()
        assert len(jobs) == args.trials, f"expected {args.trials} jobs, got {len(jobs)}"
        assert all(j["Status"] == "Succeed" for j in jobs), [j["Status"] for j in jobs]
        pai_requests = len(cloud.log.records("pai"))
        uploads = [r for r in cloud.log.records("oss") if r.method in ("PUT", "POST")]
        code = [r for r in uploads if "training_src" in r.path]
        code_bytes = sum(r.bytes_in for r in code)
        code_sent = sum(r.path.endswith(".paiexp-complete") for r in code)  # whole trees
        inputs = sum(r.bytes_in for r in uploads) - code_bytes
        by_action = {
            a: len(cloud.log.records("pai", a))
            for a in sorted({r.action for r in cloud.log.records("pai")})
        }

    n = args.trials
    durations = [end_time(j) - seconds(j["GmtCreateTime"]) for j in jobs]
    sdk_pai = sdk_requests(jobs, args.scale)
    print(
        f"{n} trials at parallelism {args.parallelism}; job durations "
        f"{min(durations):.1f}-{max(durations):.1f} s (scale {args.scale}); sweep {wall:.1f} s"
    )
    print(f"paiexp's PAI requests by action: {by_action}")
    print(
        f"code: {len(code) - code_sent} file(s), {code_bytes} bytes, "
        f"uploaded {code_sent} time(s) by paiexp"
    )
    print(f"{'per trial':30} {'paiexp':>10} {'PAI SDK':>10} {'SDK/paiexp':>11}")
    rows = (
        ("PAI API requests", pai_requests / n, sdk_pai),
        # inputs: paiexp uploads local files once; the SDK wants them on OSS beforehand (once)
        ("OSS bytes uploaded", (code_bytes + inputs) / n, code_bytes / code_sent + inputs / n),
        ("code uploads", code_sent / n, 1.0),
    )
    for label, mine, theirs in rows:
        print(f"{label:30} {mine:10.2f} {theirs:10.2f} {theirs / mine:10.2f}x")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
