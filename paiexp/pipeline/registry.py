"""``pipelines/NAME.yaml`` files, selectable as ``+pipeline=NAME``.

As with sweeps, the selected file is registered in Hydra's ConfigStore in group ``pipeline``
with package ``_global_``: its ``pipeline:`` node holds the steps, and any other key it sets
applies to every step.  Only the selected file is read.
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

PIPELINE_SELECTION = re.compile(r"^\+{0,2}pipeline=(?P<name>.*)$")


def available_pipelines(pipelines_dir: Path) -> list[str]:
    return sorted(path.stem for path in pipelines_dir.glob("*.yaml"))


def selected_pipeline(overrides: Sequence[str]) -> str | None:
    names = [m.group("name") for m in map(PIPELINE_SELECTION.match, overrides) if m]
    return names[-1] if names else None


def register_selected_pipeline(overrides: Sequence[str], pipelines_dir: Path) -> None:
    """Register the pipeline ``+pipeline=NAME`` selects; a clear error when none fits."""
    names = available_pipelines(pipelines_dir)
    listed = ", ".join(names) if names else f"none (no *.yaml in {pipelines_dir})"
    name = selected_pipeline(overrides)
    if name is not None:
        if name not in names:
            raise UserError(f"pipeline={name}: no such pipeline; available: {listed}")
        node = _load(pipelines_dir / f"{name}.yaml")
        ConfigStore.instance().store(group="pipeline", name=name, node=node, package="_global_")
    for override in overrides:
        if override.lstrip("+~").startswith("pipeline.") and name is None:
            key = override.lstrip("+~").split("=", 1)[0]
            raise UserError(
                f"{key}: no pipeline selected; add +pipeline=NAME (available: {listed})"
            )


def _load(path: Path) -> DictConfig:
    try:
        node = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as exc:
        problem = " ".join(str(exc).split())
        raise UserError(f"{path}: not a valid YAML config: {problem}") from None
    if not isinstance(node, DictConfig) or not isinstance(node.get("pipeline"), DictConfig):
        raise UserError(f"{path}: a pipeline file needs a top-level 'pipeline:' mapping")
    if "name" not in node.pipeline:
        node.pipeline.name = path.stem
    return node
