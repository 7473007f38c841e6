"""Registers ``hydra/launcher=paiexp`` in Hydra's ConfigStore (Hydra imports this module as
it scans its plugins: it loads only the schema)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from paiexp.hydra_launch.settings import PaiexpLauncherConf

ConfigStore.instance().store(
    group="hydra/launcher", name="paiexp", node=PaiexpLauncherConf, provider="paiexp"
)
