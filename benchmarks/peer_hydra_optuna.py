"""paiexp's main job against its nearest peer: hydra-optuna-sweeper + hydra-joblib-launcher.

The same search, run side by side from this one process: the xgb example's 8-parameter space
(``sweeps/xgb.yaml``, its ranges spelt as hydra-optuna-sweeper spells them), TPE seeded 42,
30 trials, 2 at a time, on the same data, model and library versions.

- peer: a Hydra app whose task trains in its joblib worker processes (in-process trials, the
  tool a Hydra user picks), in a virtual environment of its own under paiexp's cache
  (``bench-peer-venv``, made once: hydra-optuna-sweeper 1.3 pins optuna < 3);
- paiexp: ``python -m paiexp +sweep=xgb`` in a fresh copy of the starter project (each trial
  its own process, MLflow tracking and the end-of-sweep plots included).

A shared machine drifts, so they run in the order peer, paiexp, paiexp, peer (``--order``),
compared as sums (per run, should one run more often). Prints both wall-clocks, their ratio
and both best test AUCs. Goal: paiexp / peer <= 1.0 with a best AUC no worse than the peer's
by more than 0.002.

Then paiexp's per-trial cost at parallelism 1 and 2 (``--cost-parallelism``; pruning off:
every trial trains fully): each trial's job (its runner's start to its end) against the
trial's own training time (the same trials' training timed in this process, its imports
done), and the whole command as slot-seconds per trial (wall-clock x parallelism / trials:
start-up and end included).

    python benchmarks/peer_hydra_optuna.py [--trials 30] [--cost-trials 12]
        [--order peer paiexp paiexp peer] [--cost-parallelism 1 2]
    python benchmarks/peer_hydra_optuna.py --quick    # seconds once the peer's environment
        # is made: 1 trial, order peer paiexp, the per-trial cost at parallelism 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from bench_harness import REPO, parse_args

from paiexp.util.cache import cache_root
from paiexp.util.jsonfiles import read_json

EXAMPLE = REPO / "examples" / "xgb"
GOAL_RATIO, GOAL_AUC = 1.0, 0.002
PEER = [
    "hydra-core==1.3.*",
    "hydra-optuna-sweeper==1.3.*",
    "hydra-joblib-launcher==1.2.*",
    "optuna<3",
    "sqlalchemy<2",  # optuna 2's storages
]
SAME_AS_HERE = ["xgboost-cpu", "numpy", "pandas"]  # the training's libraries, at our versions
BEST = re.compile(r"best test-auc=([0-9.]+)")

PEER_APP = '''
"""The xgb example's training as a hydra-optuna-sweeper task: in-process, returns the AUC."""
import os
import sys
from pathlib import Path

import hydra
import numpy as np
import xgboost as xgb
from hydra.core.hydra_config import HydraConfig

sys.path.insert(0, {example!r})
import train  # the example's own data loading and AUC


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg):
    os.environ["PAI_INPUT_TRAIN"] = {train_csv!r}
    os.environ["PAI_INPUT_TEST"] = {test_csv!r}
    hp = cfg.hp
    features, labels = train.load_channel("train")
    test_features, test_labels = train.load_channel("test")
    rng = np.random.default_rng(42)
    is_validation = rng.random(len(features)) < 0.2
    booster = xgb.train(
        {{
            "objective": "binary:logistic",
            "eval_metric": "logloss",
            "max_depth": hp.max_depth,
            "eta": hp.learning_rate,
            "subsample": hp.subsample,
            "colsample_bytree": hp.colsample_bytree,
            "min_child_weight": hp.min_child_weight,
            "gamma": hp.gamma,
            "lambda": hp.reg_lambda,
            "seed": 42,
        }},
        xgb.DMatrix(features[~is_validation], label=labels[~is_validation]),
        num_boost_round=hp.n_estimators,
        evals=[(xgb.DMatrix(features[is_validation], label=labels[is_validation]), "validation")],
        verbose_eval=False,
    )
    test = xgb.DMatrix(test_features, label=test_labels)
    auc = train.auc(test_labels.to_numpy(), booster.predict(test))
    booster.save_model(str(Path(HydraConfig.get().runtime.output_dir) / "model.json"))
    return auc


if __name__ == "__main__":
    main()
'''


def peer_python() -> Path:
    """The peer's interpreter, its environment made once under paiexp's cache."""
    venv = cache_root() / "bench-peer-venv"
    python = venv / "bin" / "python"
    wanted = [*PEER, *(f"{name}=={metadata.version(name)}" for name in SAME_AS_HERE)]
    marker = venv / "requirements.txt"
    if not (python.exists() and marker.exists() and marker.read_text() == "\n".join(wanted)):
        shutil.rmtree(venv, ignore_errors=True)
        print(f"making the peer's environment in {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", *wanted]
        subprocess.run(pip, check=True)
        marker.write_text("\n".join(wanted))
    return python


def hydra_optuna_params(params: dict[str, Any]) -> dict[str, str]:
    """paiexp's search space as hydra-optuna-sweeper writes it: ``hp.NAME: EXPRESSION``."""
    spelt = {}
    for name, value in params.items():
        if isinstance(value, dict):  # {type: float, low, high, log}
            interval = f"interval({value['low']}, {value['high']})"
            value = f"tag(log, {interval})" if value.get("log") else interval
        match = re.fullmatch(r"range\((\d+), *(\d+), *(\d+)\)", str(value))
        if match:  # paiexp's range excludes its end, hydra-optuna-sweeper's includes it
            start, stop, step = map(int, match.groups())
            value = f"range({start}, {start + (stop - 1 - start) // step * step}, {step})"
        spelt[f"hp.{name}"] = str(value)
    return spelt


def write_peer(root: Path, sweep: dict[str, Any], trials: int) -> Path:
    """The peer's Hydra app and config for the sweep's search."""
    root.mkdir(parents=True)
    data = EXAMPLE / "data"
    (root / "app.py").write_text(
        PEER_APP.format(
            example=str(EXAMPLE),
            train_csv=str(data / "train.csv"),
            test_csv=str(data / "test.csv"),
        )
    )
    job = yaml.safe_load((REPO / "conf" / "job" / "xgb.yaml").read_text())
    hp = {name: job["hyperparameters"][name] for name in sweep["params"]}
    config = {
        "defaults": [
            {"override hydra/sweeper": "optuna"},
            {"override hydra/launcher": "joblib"},
            "_self_",
        ],
        "hp": hp,
        "hydra": {
            "sweeper": {
                "sampler": {"_target_": "optuna.samplers.TPESampler", "seed": 42},
                "direction": "maximize",
                "study_name": "xgb",
                "storage": None,
                "n_trials": trials,
                "n_jobs": sweep["parallelism"],
                "params": hydra_optuna_params(sweep["params"]),
            },
            "launcher": {"n_jobs": sweep["parallelism"]},
            "sweep": {"dir": str(root / "multirun")},
        },
    }
    (root / "conf").mkdir()
    (root / "conf" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def run_peer(python: Path, root: Path) -> tuple[float, float]:
    """Seconds of the peer's whole command, and its best value."""
    shutil.rmtree(root / "multirun", ignore_errors=True)
    started = time.perf_counter()
    subprocess.run(
        [str(python), "app.py", "--multirun"],
        cwd=root,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    results = yaml.safe_load((root / "multirun" / "optimization_results.yaml").read_text())
    return seconds, float(results["best_value"])


def fresh_project(workdir: Path) -> Path:
    project = Path(tempfile.mkdtemp(prefix="paiexp-", dir=workdir))
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, project / name, symlinks=False)
    return project


def run_paiexp(workdir: Path, *overrides: str) -> tuple[float, float, Path]:
    """Seconds of ``python -m paiexp +sweep=xgb OVERRIDES`` in a fresh project, its best
    value and the project."""
    project = fresh_project(workdir)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "paiexp", "+sweep=xgb", *overrides],
        cwd=project,
        check=True,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    best = BEST.search(done.stdout + done.stderr)
    assert best, "the sweep printed no best test-auc"
    return seconds, float(best.group(1)), project


def job_seconds(project: Path) -> list[float]:
    """Each trial's job, from its runner's start to its end (``state.json``)."""
    states = (project / ".paiexp" / "jobs").glob("*/state.json")
    return [state["ended_at"] - state["started_at"] for state in map(read_json, states)]


def training_seconds(project: Path) -> list[float]:
    """Each trial's own training: ``train.main()`` with the trial's arguments, timed here
    with its imports done (this process: all the CPUs' threads)."""
    sys.path.insert(0, str(EXAMPLE))
    import train

    jobs = sorted(p for p in (project / ".paiexp" / "jobs").iterdir() if not p.name.startswith("."))
    data, model = EXAMPLE / "data", Path(tempfile.mkdtemp(dir=project))
    os.environ.update(
        PAI_INPUT_TRAIN=str(data / "train.csv"),
        PAI_INPUT_TEST=str(data / "test.csv"),
        PAI_OUTPUT_MODEL=str(model),
    )
    seconds = []
    for job_dir in jobs:
        hyperparameters = json.loads((job_dir / "spec.json").read_text())["hyperparameters"]
        sys.argv = ["train.py", *(f"--{n}={v}" for n, v in hyperparameters.items())]
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            train.main()
        seconds.append(time.perf_counter() - started)
    return seconds


def per_trial_cost(workdir: Path, trials: int, parallelisms: list[int]) -> None:
    print(f"\nper-trial cost, pruning off, {trials} trials (slot-seconds = wall x P / trials)")
    for parallelism in parallelisms:
        wall, _, project = run_paiexp(
            workdir,
            f"sweep.n_trials={trials}",
            f"sweep.parallelism={parallelism}",
            "sweep.pruner.name=none",
        )
        slot = wall * parallelism / trials
        job = statistics.median(job_seconds(project))  # the first waits for the imports
        train = statistics.median(training_seconds(project))
        print(
            f"  P={parallelism}: a trial's job (median) {job:6.3f} s (runner start to end) vs "
            f"its own training {train:6.3f} s: overhead {job - train:+.3f} s; whole command "
            f"{wall:5.2f} s = {slot:5.3f} slot-seconds per trial"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--cost-trials", type=int, default=12, help="0: skip the per-trial cost")
    parser.add_argument(
        "--order", nargs="+", choices=("peer", "paiexp"), default=["peer", "paiexp"] * 2
    )
    parser.add_argument("--cost-parallelism", type=int, nargs="+", default=[1, 2])
    args = parse_args(
        parser, trials=1, cost_trials=1, order=["peer", "paiexp"], cost_parallelism=[2]
    )
    if set(args.order) != {"peer", "paiexp"}:
        parser.error("--order names both peer and paiexp: they are compared")

    sweep = yaml.safe_load((REPO / "sweeps" / "xgb.yaml").read_text())["sweep"]
    python = peer_python()
    workdir = Path(tempfile.mkdtemp(prefix="paiexp-peer-"))
    peer_root = write_peer(workdir / "peer", sweep, args.trials)
    trials = f"sweep.n_trials={args.trials}"
    peer: list[tuple[float, float]] = []
    ours: list[tuple[float, float]] = []
    for side in args.order:
        if side == "peer":
            peer.append(run_peer(python, peer_root))
        else:
            ours.append(run_paiexp(workdir, trials)[:2])

    peer_seconds, our_seconds = sum(s for s, _ in peer), sum(s for s, _ in ours)
    peer_best, our_best = min(b for _, b in peer), min(b for _, b in ours)
    ratio = (our_seconds / len(ours)) / (peer_seconds / len(peer))
    auc_met = our_best >= peer_best - GOAL_AUC
    print(
        f"search: sweeps/xgb.yaml, {args.trials} trials, {sweep['parallelism']} at a time, TPE 42"
    )
    print("hydra-optuna-sweeper + joblib: " + ", ".join(f"{s:6.2f} s" for s, _ in peer))
    print("paiexp +sweep=xgb:             " + ", ".join(f"{s:6.2f} s" for s, _ in ours))
    print(
        f"ratio paiexp / hydra-optuna-sweeper: {ratio:.2f}  (per run, order "
        f"{'-'.join(args.order)}; goal <= {GOAL_RATIO:.1f}: "
        f"{'met' if ratio <= GOAL_RATIO else 'NOT met'})"
    )
    print(
        "best test-auc: hydra-optuna-sweeper "
        + ", ".join(f"{b:.6f}" for _, b in peer)
        + "; paiexp "
        + ", ".join(f"{b:.6f}" for _, b in ours)
        + f"  (the worse of each: paiexp no worse by more than {GOAL_AUC}: "
        + f"{'met' if auc_met else 'NOT met'})"
    )
    if args.cost_trials:
        per_trial_cost(workdir, args.cost_trials, args.cost_parallelism)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
