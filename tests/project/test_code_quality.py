"""ruff, mypy and import-linter are part of the test suite, so CI holds the code to them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def test_ruff_passes() -> None:
    result = run_tool("ruff", "check", "paiexp", "hydra_plugins", "tests", "benchmarks", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)  # a cold mypy cache on a busy machine
def test_mypy_passes() -> None:
    result = run_tool("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_test_command_is_what_ci_runs() -> None:
    ci_command = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in (REPO / "README.md").read_text()


def test_the_import_contracts_hold() -> None:
    """import-linter's contracts (pyproject.toml): backends import no launcher, only the entry
    points import the command line, and no module imports one that imports it back (type-only
    imports included), one circle named."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout, result.stdout


def test_the_command_line_runs_through_the_python_api() -> None:
    """The CLI composes, checks and runs jobs, sweeps and pipelines with the API's calls
    (paiexp.api.jobs, _sweeps, _pipelines): no launcher, runner or submission of its own."""
    imported = _imported(REPO / "paiexp" / "cli.py", "paiexp.")
    assert {"paiexp.api.jobs", "paiexp.api.sweeps", "paiexp.api.pipelines"} <= imported
    runners = {"paiexp.sweep.launcher", "paiexp.pipeline.runner", "paiexp.pipeline.resume"}
    assert not imported & runners
    names = {
        alias.name
        for node in ast.walk(ast.parse((REPO / "paiexp" / "cli.py").read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "paiexp.runs"
        for alias in node.names
    }
    assert not names & {"submit", "follow", "prepare_config"}


def _imported(path: Path, prefix: str) -> set[str]:
    """The modules starting with ``prefix`` that ``path`` imports anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
            found.add(str(node.module))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(prefix))
    return found
