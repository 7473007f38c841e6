"""References to earlier steps' results in a step's overrides: ``${steps.NAME.path...}``.

OmegaConf resolves them (see :mod:`paiexp.pipeline.step_config`); here they are only found,
to be checked before anything runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from paiexp.pipeline.condition import Reference

INTERPOLATION = re.compile(r"\$\{steps\.([A-Za-z0-9_.\-]+)\}")


def override_references(overrides: Any, key: str) -> Iterator[tuple[str, Reference]]:
    """Each ``${steps.X...}`` in the (unresolved, plain) overrides, with the key it is at."""
    if isinstance(overrides, dict):
        for name, value in overrides.items():
            yield from override_references(value, f"{key}.{name}")
    elif isinstance(overrides, list):
        for index, value in enumerate(overrides):
            yield from override_references(value, f"{key}[{index}]")
    elif isinstance(overrides, str):
        for match in INTERPOLATION.finditer(overrides):
            step, *path = match.group(1).split(".")
            yield key, Reference(step, tuple(path))
