"""``sweeps/NAME.yaml`` files, selectable as ``+sweep=NAME``.

Each file is registered in Hydra's ConfigStore in group ``sweep`` with package ``_global_``,
so it can set any key (``job.hyperparameters.seed: 7``) beside its ``sweep:`` node.  Without
this group Hydra would read ``+sweep=NAME`` as a plain value and silently run one job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paiexp.errors import UserError

SWEEP_SELECTION = re.compile(r"^\+{0,2}sweep=(?P<name>.*)$")


def available_sweeps(sweeps_dir: Path) -> list[str]:
    return sorted(path.stem for path in sweeps_dir.glob("*.yaml"))


def register_selected_sweep(overrides: Sequence[str], sweeps_dir: Path) -> None:
    """Register the sweep ``+sweep=NAME`` selects; a clear error when none fits.

    Only the selected file is read, so a broken file elsewhere in sweeps/ does not get in the
    way of other sweeps or of single runs.
    """
    names = available_sweeps(sweeps_dir)
    listed = ", ".join(names) if names else f"none (no *.yaml in {sweeps_dir})"
    selected = [m.group("name") for m in map(SWEEP_SELECTION.match, overrides) if m]
    for name in selected:
        if name not in names:
            raise UserError(f"sweep={name}: no such sweep; available: {listed}")
        path = sweeps_dir / f"{name}.yaml"
        ConfigStore.instance().store(group="sweep", name=name, node=_load(path), package="_global_")
    for override in overrides:
        if override.lstrip("+~").startswith("sweep.") and not selected:
            key = override.lstrip("+~").split("=", 1)[0]
            raise UserError(f"{key}: no sweep selected; add +sweep=NAME (available: {listed})")


def _load(path: Path) -> DictConfig:
    try:
        node = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as exc:
        problem = " ".join(str(exc).split())
        raise UserError(f"{path}: not a valid YAML config: {problem}") from None
    if not isinstance(node, DictConfig) or not isinstance(node.get("sweep"), DictConfig):
        raise UserError(f"{path}: a sweep file needs a top-level 'sweep:' mapping")
    if "name" not in node.sweep:
        node.sweep.name = path.stem
    return node
