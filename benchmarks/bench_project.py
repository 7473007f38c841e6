"""A throwaway project for a benchmark: the repository's ``conf/`` with the benchmark's own job
as the default job, and one sweep file."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from bench_harness import REPO


def write_project(root: Path, job: dict[str, Any], sweep_name: str, sweep: dict[str, Any]) -> Path:
    """``conf/job/<job name>.yaml`` (made the default job) and ``sweeps/<sweep_name>.yaml``."""
    shutil.copytree(REPO / "conf", root / "conf")
    (root / "conf" / "job" / f"{job['name']}.yaml").write_text(yaml.safe_dump(job))
    config = yaml.safe_load((root / "conf" / "config.yaml").read_text())
    config["defaults"] = [
        {"job": job["name"]} if isinstance(entry, dict) and "job" in entry else entry
        for entry in config["defaults"]
    ]
    (root / "conf" / "config.yaml").write_text(yaml.safe_dump(config))
    (root / "sweeps").mkdir()
    (root / "sweeps" / f"{sweep_name}.yaml").write_text(yaml.safe_dump({"sweep": sweep}))
    return root
