"""The Python API's costs against its goals: ``import paiexp`` in a fresh interpreter
(<= 0.3 s, none of MLflow, Optuna, pandas, oss2, docker loaded) and ``Sweep.results()`` of
a 2,000-trial study with one MLflow child run per trial in a local ``mlflow.db`` (<= 2 s).

The study and its runs are written directly (a journal of 2,000 finished trials, the runs
through MLflow's client, as a sweep's tracking writes them), in a temporary directory.

    python benchmarks/api.py [--trials 2000] [--repeats 5]
    python benchmarks/api.py --quick      # seconds: 2 trials, once
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_harness import parse_args

IMPORT_GOAL, RESULTS_GOAL = 0.3, 2.0
HEAVY = ("mlflow", "optuna", "pandas", "oss2", "docker")
MEASURE_IMPORT = f"""
import sys, time
start = time.perf_counter()
import paiexp
took = time.perf_counter() - start
heavy = sorted(n for n in sys.modules if n.split(".")[0] in {HEAVY!r})
print(took, ",".join(heavy) or "-")
"""


def import_seconds(repeats: int) -> tuple[float, float, str]:
    """(median seconds of ``import paiexp``, of the interpreter's start-up, heavy modules)."""
    imports, startups, heavy = [], [], "-"
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", MEASURE_IMPORT], capture_output=True, text=True, check=True
        )
        took, heavy = done.stdout.split()
        imports.append(float(took))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        startups.append(time.perf_counter() - start)
    return statistics.median(imports), statistics.median(startups), heavy


def write_study(root: Path, trials: int) -> tuple[str, str]:
    """A finished study of ``trials`` trials and its parent and child runs: (storage, URI)."""
    import optuna
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient
    from optuna.distributions import FloatDistribution

    from paiexp.sweep.study import create_storage
    from paiexp.tracking.sqlite_store import create_sqlite_database

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage_path = str(root / "optuna.journal")
    study = optuna.create_study(
        study_name="bench", storage=create_storage(storage_path), direction="maximize"
    )
    uri = f"sqlite:///{root / 'mlflow.db'}"
    create_sqlite_database(uri)  # as a sweep's tracking makes it: MLflow's schema, cached
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("bench")
    parent = client.create_run(experiment, run_name="bench").info.run_id
    study.set_user_attr("paiexp:parent_run_id", parent)
    distributions = {"x": FloatDistribution(-1, 1), "y": FloatDistribution(0, 10)}
    made = []
    for number in range(trials):
        x, y = (number % 200) / 100 - 1, number % 10
        job = f"bench-t{number:04d}"
        made.append(
            optuna.trial.create_trial(
                params={"x": x, "y": y},
                distributions=distributions,
                value=-(x * x) - y,
                user_attrs={"paiexp:job_name": job},
            )
        )
        run = client.create_run(experiment, run_name=f"trial-{number}").info.run_id
        tags = {
            "mlflow.parentRunId": parent,
            "paiexp.trial_number": str(number),
            "paiexp.job_name": job,
            "paiexp.model_uri": f"file:///models/{job}",
        }
        now = int(time.time() * 1000)
        client.log_batch(
            run,
            metrics=[Metric("score", -(x * x) - y, now, 0), Metric("loss", x * x, now, 0)],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
    study.add_trials(made)
    return storage_path, uri


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parse_args(parser, trials=2, repeats=1)

    imported, startup, heavy = import_seconds(args.repeats)
    print(f"import paiexp:           {imported:.3f} s (goal <= {IMPORT_GOAL} s; the interpreter")
    print(f"                         starts in {startup:.3f} s); heavy modules loaded: {heavy}")

    import paiexp

    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        start = time.perf_counter()
        storage, uri = write_study(root, args.trials)
        print(
            f"study written:           {args.trials} trials in {time.perf_counter() - start:.0f} s"
        )
        sweep = paiexp.Sweep("bench", storage, uri, base_dir=root)
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            frame = sweep.results()
            seconds.append(time.perf_counter() - start)
        complete = frame["run_id"].notna().sum()
        print(
            f"Sweep.results():         {statistics.median(seconds):.2f} s median, "
            f"{max(seconds):.2f} s slowest (goal <= {RESULTS_GOAL} s): {len(frame)} rows, "
            f"{complete} with their run"
        )


if __name__ == "__main__":
    main()
