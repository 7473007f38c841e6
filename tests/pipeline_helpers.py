"""Projects and MLflow views for the pipeline tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from conftest import REPO, all_runs


def starter_project(root: Path) -> Path:
    """A copy of the repository's project: conf/, sweeps/, pipelines/, examples/."""
    for name in ("conf", "sweeps", "pipelines", "examples"):
        shutil.copytree(REPO / name, root / name)
    return root


def write_pipeline(root: Path, name: str, steps: dict[str, Any]) -> None:
    (root / "pipelines").mkdir(exist_ok=True)
    text = yaml.safe_dump({"pipeline": {"steps": steps}}, sort_keys=False)
    (root / "pipelines" / f"{name}.yaml").write_text(text)


def state(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / ".paiexp" / "pipelines" / f"{name}.json").read_text())


def statuses(root: Path, name: str) -> dict[str, str]:
    return {step: record["status"] for step, record in state(root, name)["steps"].items()}


def job_dirs(root: Path) -> list[str]:
    jobs = root / ".paiexp" / "jobs"
    return sorted(path.name for path in jobs.iterdir() if path.is_dir()) if jobs.is_dir() else []


def pipeline_runs(root: Path) -> tuple[Any, dict[str, list[Any]], list[Any]]:
    """(the pipeline's parent run, its step runs by step, every other run)."""
    runs = all_runs(root)
    (parent,) = [r for r in runs if r.data.tags.get("paiexp.kind") == "pipeline"]
    steps: dict[str, list[Any]] = {}
    others = []
    for run in runs:
        step = run.data.tags.get("paiexp.pipeline_step")
        if step is not None:
            assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
            steps.setdefault(step, []).append(run)
        elif run is not parent:
            others.append(run)
    return parent, steps, others


def run_ids(root: Path) -> set[str]:
    """Every run in the project's MLflow store."""
    return {run.info.run_id for run in all_runs(root)}
