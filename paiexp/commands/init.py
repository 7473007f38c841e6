"""``paiexp init``: a starter project (conf/, sweeps/, pipelines/, examples/) in a new directory.

The starter is the project this repository runs (shipped inside the package), so what
``paiexp init`` writes is exactly what the README's main command runs.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from paiexp.errors import UserError

PARTS = ("conf", "sweeps", "pipelines", "examples")
GITIGNORE = """\
# paiexp run artifacts
mlflow.db*
mlruns/
mlartifacts/
optuna.journal*
.paiexp/
reports/
"""


def write_starter(directory: Path) -> list[Path]:
    """Copy the starter project into ``directory``; refuse to overwrite any part of one."""
    existing = [directory / part for part in PARTS if (directory / part).exists()]
    if existing:
        raise UserError(
            f"init: {existing[0]} already exists; paiexp init writes a new project "
            "into an empty directory (or one without conf/, sweeps/, examples/)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    with resources.as_file(resources.files("paiexp") / "starter") as starter:
        written = []
        for part in PARTS:
            shutil.copytree(
                starter / part,
                directory / part,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
            written.append(directory / part)
    gitignore = directory / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text(GITIGNORE)
        written.append(gitignore)
    return written
