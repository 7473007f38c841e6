"""Wall-clock latency of commands that need no MLflow: ``paiexp --help`` and
``paiexp download RUN_ID DEST`` of a run in the local ``mlflow.db``.

In a fresh project, one tiny job is run through paiexp (its model: one small file) to have a
tracked run; then each command runs as a new ``python -m paiexp`` process, as a user types
it, ``--repeats`` times. Prints the median and the slowest of each against its goal (--help
<= 0.5 s, download <= 2 s), the interpreter's own start-up for scale, and whether the
download imported MLflow (it reads the SQLite store and the run's files directly).

    python benchmarks/cli_latency.py [--repeats 7]
    python benchmarks/cli_latency.py --quick      # seconds: once
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_harness import REPO, parse_args

GOALS = {"--help": 0.5, "download": 2.0}
TINY_JOB = """\
name: tiny
command: mkdir -p $PAI_OUTPUT_MODEL && echo weights > $PAI_OUTPUT_MODEL/model.txt
"""


def seconds_of(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def tracked_run(project: Path, env: dict[str, str]) -> str:
    """The id of a finished run of the tiny job (MLflow's first start is paid here)."""
    done = subprocess.run(
        [sys.executable, "-m", "paiexp", "job=tiny", "-q"],
        cwd=project,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    found = re.search(r"MLflow run ([0-9a-f]{32})", done.stderr)
    assert found, done.stderr
    return found.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parse_args(parser, repeats=1)

    project = Path(tempfile.mkdtemp(prefix="paiexp-cli-latency-"))
    shutil.copytree(REPO / "conf", project / "conf")
    (project / "conf" / "job" / "tiny.yaml").write_text(TINY_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    run_id = tracked_run(project, env)

    paiexp = [sys.executable, "-m", "paiexp"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "--help": [*paiexp, "--help"],
        "--cfg job": [*paiexp, "--cfg", "job"],
        "download": [*paiexp, "download", run_id, str(project / "fetched")],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):  # interleaved: every command sees the same machine load
        for name, command in commands.items():
            times[name].append(seconds_of(command, project, env))
    assert (project / "fetched" / "model.txt").read_text() == "weights\n"

    probe = (
        "import sys; from paiexp.cli import main; "
        f"main(['download', {run_id!r}, {str(project / 'probe')!r}]); "
        "print('mlflow' in sys.modules)"
    )
    imported = (
        subprocess.run(
            [sys.executable, "-c", probe], cwd=project, env=env, check=True, capture_output=True
        )
        .stdout.decode()
        .split()[-1]
    )

    print(f"repeats: {args.repeats}, interleaved; load average {os.getloadavg()[0]:.2f}")
    for name, seconds in times.items():
        goal = GOALS.get(name)
        median = statistics.median(seconds)
        verdict = ""
        if goal is not None:
            verdict = f"  goal <= {goal:.1f} s: {'met' if median <= goal else 'NOT met'}"
        label = name if name.startswith("python") else f"paiexp {name}"
        print(f"{label:<18} median {median:6.3f} s, slowest {max(seconds):6.3f} s{verdict}")
    print(f"download imported MLflow: {'yes' if imported == 'True' else 'no'}")
    shutil.rmtree(project, ignore_errors=True)


if __name__ == "__main__":
    main()
