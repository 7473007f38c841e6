"""A project with a synthetic job and sweep, for launcher tests."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from conftest import REPO

JOB = {
    "name": "synthetic",
    "command": "python job.py",
    "source_dir": "synthetic",
    "hyperparameters": {"x": 0.0, "duration": 0.5, "steps": 5},
    "metric_definitions": [
        {"name": "loss", "regex": r"loss=([-+0-9.eE]+|nan)"},
        {"name": "score", "regex": r"score=([-+0-9.eE]+|nan)"},
    ],
}


def synthetic_project(root: Path, sweep: dict[str, Any], job: dict[str, Any] | None = None) -> Path:
    shutil.copytree(REPO / "conf", root / "conf")
    shutil.copytree(REPO / "tests" / "synthetic", root / "synthetic")
    (root / "conf" / "job" / "synthetic.yaml").write_text(yaml.safe_dump({**JOB, **(job or {})}))
    config = yaml.safe_load((root / "conf" / "config.yaml").read_text())
    config["defaults"] = [
        "paiexp_schema",
        {"job": "synthetic"},
        {"backend": "local"},
        {"tracker": "mlflow"},
        "_self_",
    ]
    (root / "conf" / "config.yaml").write_text(yaml.safe_dump(config))
    (root / "sweeps").mkdir()
    base = {"objective": {"metric": "score", "direction": "minimize"}, "parallelism": 2}
    (root / "sweeps" / "syn.yaml").write_text(yaml.safe_dump({"sweep": {**base, **sweep}}))
    return root


def load_study(root: Path, name: str = "syn") -> Any:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(root / "optuna.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def sweep_runs(root: Path) -> tuple[list[Any], list[Any]]:
    """(parent runs, child runs) in the project's mlflow.db."""
    from conftest import all_runs

    runs = all_runs(root)
    parents = [r for r in runs if r.data.tags.get("paiexp.kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children
