"""A tracking server nobody answers at: one line naming tracker.uri within seconds, no job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import assert_nothing_started, assert_one_line_error, clean_env, run_paiexp
from sweep_helpers import synthetic_project

UNREACHABLE = "tracker.uri=http://127.0.0.1:1"


@pytest.mark.parametrize("sweep", [False, True], ids=["single-run", "sweep"])
def test_an_unreachable_tracking_server_is_a_one_line_error_before_any_job(
    tmp_path: Path, sweep: bool
) -> None:
    root = synthetic_project(tmp_path / "project", {"params": {"x": "interval(-1, 1)"}})
    ledger = tmp_path / "ledger.txt"
    args = ["+sweep=syn", UNREACHABLE] if sweep else [UNREACHABLE]
    started = time.monotonic()
    done = run_paiexp(root, *args, timeout=60, env=clean_env(LEDGER=str(ledger)))
    took = time.monotonic() - started
    line = assert_one_line_error(done)
    assert line == (
        "paiexp: error: tracker.uri: no MLflow tracking server answers at http://127.0.0.1:1 "
        "(Connection refused); start one, or set tracker.uri to one that runs"
    )
    assert took < 15, f"took {took:.1f} s"
    assert not ledger.exists()  # no job ran
    assert_nothing_started(root)
