"""Config files a command line selects by name: ``+sweep=NAME`` reads ``sweeps/NAME.yaml``,
``+pipeline=NAME`` reads ``pipelines/NAME.yaml``.

The selected file is registered in Hydra's ConfigStore in its group with package
``_global_``, so it can set any key beside its own node (``job.hyperparameters.seed: 7``
next to ``sweep:``).  Without the group Hydra would read ``+sweep=NAME`` as a plain value and
silently run one job.  Only the selected file is read, so a broken file beside it gets in
no one's way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paiexp.errors import UserError


@dataclass(frozen=True)
class ConfigFiles:
    """The ``*.yaml`` files of one group (``sweep``), each holding a ``<group>:`` node."""

    group: str

    @property
    def selection(self) -> re.Pattern[str]:
        """An override that selects a file of the group: ``+sweep=NAME`` (or ``sweep=``)."""
        return re.compile(rf"^\+{{0,2}}{self.group}=(?P<name>.*)$")

    def available(self, directory: Path) -> list[str]:
        return sorted(path.stem for path in directory.glob("*.yaml"))

    def selected(self, overrides: Sequence[str]) -> list[str]:
        return [m.group("name") for m in map(self.selection.match, overrides) if m]

    def register(self, overrides: Sequence[str], directory: Path) -> None:
        """Register the files the overrides select; a one-line error naming the available
        ones for an unknown name, or for a ``<group>.key`` override with none selected."""
        names = self.available(directory)
        listed = ", ".join(names) if names else f"none (no *.yaml in {directory})"
        selected = self.selected(overrides)
        for name in selected:
            if name not in names:
                raise UserError(f"{self.group}={name}: no such {self.group}; available: {listed}")
            node = self._load(directory / f"{name}.yaml")
            ConfigStore.instance().store(group=self.group, name=name, node=node, package="_global_")
        for override in overrides:
            key = override.lstrip("+~").split("=", 1)[0]
            if key.startswith(f"{self.group}.") and not selected:
                raise UserError(
                    f"{key}: no {self.group} selected; add +{self.group}=NAME (available: {listed})"
                )

    def _load(self, path: Path) -> DictConfig:
        try:
            node = OmegaConf.load(path)
        except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as exc:
            problem = " ".join(str(exc).split())
            raise UserError(f"{path}: not a valid YAML config: {problem}") from None
        if not isinstance(node, DictConfig) or not isinstance(node.get(self.group), DictConfig):
            raise UserError(
                f"{path}: a {self.group} file needs a top-level '{self.group}:' mapping"
            )
        if "name" not in node[self.group]:
            node[self.group].name = path.stem
        return node


SWEEPS = ConfigFiles("sweep")  # sweeps/NAME.yaml: +sweep=NAME
# pipelines/NAME.yaml: +pipeline=NAME; its pipeline: node holds the steps, and any other key
# the file sets applies to every step
PIPELINES = ConfigFiles("pipeline")
