"""Every benchmark still runs: each script in benchmarks/, in its quick mode (``--quick``, see
benchmarks/bench_harness.py) and with this interpreter, exits 0 without a traceback and prints
its figure. A benchmark that no longer runs fails CI.

Nothing is timed: at quick sizes on a shared machine the figures mean nothing, so the tests
only check that they are printed. Each test runs its own benchmark (``pytest -n`` runs several
at once, each in the worker that runs its test). Those that run the test image need Docker:
they fail, never skip, without it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, clean_env

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

BENCHMARKS = REPO / "benchmarks"
HELPERS = {
    "bench_harness",  # the quick mode and tests/ on sys.path, imported by the benchmarks
    "bench_project",  # the throwaway project a benchmark writes, imported by the benchmarks
}
NUMBER = r"[-+]?\d+\.\d+"
# The line that carries each benchmark's result: its ratio where it has one.
FIGURES = {
    "api": rf"^Sweep\.results\(\): +{NUMBER} s median",
    "async_efficiency": rf"^paiexp / batch = {NUMBER}",
    "cli_latency": rf"^paiexp download +median +{NUMBER} s",
    "docker_instances": rf"^  start-up .*, ratio 2 / 1 {NUMBER}$",
    "docker_overhead": rf"^  docker - local {NUMBER} s; ratio docker / local {NUMBER}$",
    "launcher_cpu": rf"^launcher process CPU {NUMBER} ms per trial",
    "live_curves": rf"^fewest points in a running run: \d+ \(goal >= \d+\), / goal {NUMBER}$",
    "multi_instance": rf"^the second instance: .*; ratio 2 / 1: {NUMBER}$",
    "openpai_api_calls": rf"^ +\d+ +\d+ +{NUMBER} +\d+ +\d+ +{NUMBER} ",  # requests per tick
    "overhead": rf"^ratio paiexp / bare: +{NUMBER}",
    "pai_api_calls": rf"^PAI API requests +{NUMBER} +{NUMBER} +{NUMBER}x$",
    "peer_hydra_optuna": rf"^ratio paiexp / hydra-optuna-sweeper: {NUMBER}",
    "profile_launcher": rf"^launcher CPU {NUMBER} ms per trial",
    "scale": rf"^TPE's cost in utilization / ideal: {NUMBER}",
    "sweep_overhead": rf"^ratio paiexp / bare: +{NUMBER}",
}
SECONDS = 300  # for one, on a busy 2-core machine


def benchmarks() -> list[str]:
    """Every script in benchmarks/ but the helpers: a new benchmark is run once it is there."""
    return sorted(path.stem for path in BENCHMARKS.glob("*.py") if path.stem not in HELPERS)


def uses_docker(name: str) -> bool:
    """A benchmark that takes the test image's tag runs the image."""
    return "docker_image_tag" in (BENCHMARKS / f"{name}.py").read_text()


def test_every_benchmark_names_its_figure() -> None:
    assert sorted(FIGURES) == benchmarks(), "FIGURES names the line each benchmark prints"


@pytest.mark.timeout(SECONDS + 60)
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.docker] if uses_docker(n) else []) for n in benchmarks()],
)
def test_benchmark_runs_in_quick_mode(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """In a directory of its own (its working and temporary directory), its trainings on one
    thread each (XGBoost's OpenMP threads spin for cores a busy machine does not give them);
    whatever of it is left at the end (jobs, trackers, emulators) is killed with it."""
    if uses_docker(name):
        request.getfixturevalue("docker_image")  # fails, saying why, without Docker or image
    (tmp_path / "tmp").mkdir()
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick"],
            cwd=tmp_path,
            env=clean_env(TMPDIR=str(tmp_path / "tmp"), OMP_NUM_THREADS="1"),
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        process.wait(timeout=SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} --quick did not end within {SECONDS} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    out_text, err_text = stdout.read_text(), stderr.read_text()
    tail = f"{name} --quick exited {process.returncode}; its stderr ends:\n{err_text[-3000:]}"
    assert process.returncode == 0, tail
    assert "Traceback" not in err_text, tail
    assert re.search(FIGURES[name], out_text, re.MULTILINE), f"no figure in:\n{out_text}"
