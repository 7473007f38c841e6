"""The sweep's tracking applies its calls in gaps of the machine's CPU use, and at full speed
once the sweep has ended: other programs keeping every CPU busy delay its end, never stall it
(a lowered scheduling priority, which an unprivileged process cannot raise again, did)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_paiexp
from sweep_helpers import load_study, sweep_runs, synthetic_project

from paiexp.cpu_gaps import has_gap, wait_for_gap


class CountingFlag:
    """A flag set at its ``after``-th look."""

    def __init__(self, after: int) -> None:
        self.after, self.looks = after, 0

    def wait(self, timeout: float | None = None) -> bool:
        self.looks += 1
        return self.looks >= self.after


def test_a_gap_is_a_cpu_with_nothing_else_to_run() -> None:
    assert not has_gap(0)  # this thread runs: no CPU of none is free
    assert has_gap(10**6)


def test_the_wait_for_a_gap_ends_when_the_sweep_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set())  # never a gap
    flag = CountingFlag(after=3)
    wait_for_gap(flag, poll=0)
    assert flag.looks == 3


@pytest.fixture
def busy_cpus() -> Iterator[None]:
    """Every CPU kept busy by other programs (one more spinner than CPUs), at normal priority."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(len(os.sched_getaffinity(0)) + 1)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.timeout(240)
def test_a_sweep_ends_while_other_programs_keep_every_cpu_busy(
    tmp_path: Path, busy_cpus: None
) -> None:
    root = synthetic_project(
        tmp_path, {"params": {"x": "interval(-1, 1)", "duration": 0.1, "steps": 1}, "n_trials": 3}
    )
    done = run_paiexp(root, "+sweep=syn", timeout=200)
    assert done.returncode == 0, done.stderr
    assert [t.state.name for t in load_study(root).trials] == ["COMPLETE"] * 3
    parents, children = sweep_runs(root)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert [c.info.status for c in children] == ["FINISHED"] * 3
