"""``sweeps/NAME.yaml`` files, selectable as ``+sweep=NAME``.

Each file is registered in Hydra's ConfigStore in group ``sweep`` with package ``_global_``,
so it can set any key (``job.hyperparameters.seed: 7``) beside its ``sweep:`` node.  Without
this group Hydra would read ``+sweep=NAME`` as a plain value and silently run one job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paiexp.errors import UserError

SWEEP_SELECTION = re.compile(r"^\+{0,2}sweep=(?P<name>.*)$")


def available_sweeps(sweeps_dir: Path) -> list[str]:
    return sorted(path.stem for path in sweeps_dir.glob("*.yaml"))


def register_sweeps(sweeps_dir: Path) -> None:
    store = ConfigStore.instance()
    for path in sorted(sweeps_dir.glob("*.yaml")):
        store.store(group="sweep", name=path.stem, node=_load(path), package="_global_")


def check_selection(overrides: Sequence[str], sweeps_dir: Path) -> None:
    """A clear error for ``+sweep=NAME`` naming no sweep file, or ``sweep.x=`` without one."""
    names = available_sweeps(sweeps_dir)
    listed = ", ".join(names) if names else f"none (no *.yaml in {sweeps_dir})"
    selected = False
    for override in overrides:
        match = SWEEP_SELECTION.match(override)
        if match:
            selected = True
            if match.group("name") not in names:
                raise UserError(f"sweep={match.group('name')}: no such sweep; available: {listed}")
    for override in overrides:
        if override.lstrip("+~").startswith("sweep.") and not selected:
            key = override.lstrip("+~").split("=", 1)[0]
            raise UserError(f"{key}: no sweep selected; add +sweep=NAME (available: {listed})")


def _load(path: Path) -> DictConfig:
    try:
        node = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError) as exc:
        raise UserError(f"{path}: not a valid YAML config: {exc}") from None
    if not isinstance(node, DictConfig) or not isinstance(node.get("sweep"), DictConfig):
        raise UserError(f"{path}: a sweep file needs a top-level 'sweep:' mapping")
    if "name" not in node.sweep:
        node.sweep.name = path.stem
    return node
