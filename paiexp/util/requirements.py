"""A job's requirement lines, and whether a Python environment meets them already.

Standard library only (``packaging`` where it is installed, else pip's copy of it): the local
job runner imports it without ``site``, and a docker job's entry script runs this very file
with the image's Python (3.8 or later) to skip pip when nothing is missing::

    python requirements.py LINE...    exit status 0: every line is met
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


def requirement_lines(requirements: Iterable[str], working_dir: str) -> list[str]:
    """``requirements`` and the lines of ``working_dir``'s requirements.txt, minus comments."""
    lines = list(requirements)
    path = os.path.join(working_dir, "requirements.txt")
    if os.path.isfile(path):
        with open(path) as stream:
            lines += [line.strip() for line in stream.read().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def satisfied(line: str) -> bool:
    """Whether the installed packages meet one requirement line (options and URLs never do:
    pip decides those)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        from packaging.requirements import Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
        except ImportError:
            return False
    try:
        requirement = Requirement(line)
    except Exception:  # InvalidRequirement, of whichever packaging was found
        return False
    if requirement.marker is not None and not requirement.marker.evaluate():
        return True
    try:
        installed = version(requirement.name)
    except PackageNotFoundError:
        return False
    return requirement.specifier.contains(installed, prereleases=True)


if __name__ == "__main__":
    sys.exit(0 if all(satisfied(line) for line in sys.argv[1:]) else 1)
