"""ruff and mypy are part of the test suite, so CI holds the code to them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def test_ruff_passes() -> None:
    result = run_tool("ruff", "check", "paiexp", "tests", "benchmarks", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)  # a cold mypy cache on a busy machine
def test_mypy_passes() -> None:
    result = run_tool("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_test_command_is_what_ci_runs() -> None:
    ci_command = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in (REPO / "README.md").read_text()
