"""What the benchmarks share: their quick mode, and the test harness's modules.

Every benchmark takes ``--quick``: the same code paths at the smallest sizes and repeats, done
in seconds, its figures printed as a full run prints them (too small to mean anything: a check
that it still runs, which tests/project/test_benchmarks.py makes in CI). Options given on the
command line win over the quick values.

Importing this module puts ``tests/`` on ``sys.path`` (this one place): the emulators
(``emulator``, ``openpai_server``) and the test images' tags, the tests' own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from image_tags import docker_image_tag  # noqa: E402

__all__ = ["REPO", "docker_image_tag", "parse_args"]


def parse_args(parser: argparse.ArgumentParser, **quick: object) -> argparse.Namespace:
    """The command line, with ``--quick``: then the options not given take ``quick``'s values."""
    spelt = ", ".join(f"{name}={value}" for name, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"in seconds: {spelt}")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args()
    return args
