"""Registers ``hydra/sweeper=paiexp`` and the samplers of ``hydra/sweeper/sampler`` (as
hydra-optuna-sweeper names them, so its apps' defaults compose) in Hydra's ConfigStore."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from paiexp.hydra_launch.settings import SAMPLER_CONFS, PaiexpSweeperConf

store = ConfigStore.instance()
store.store(group="hydra/sweeper", name="paiexp", node=PaiexpSweeperConf, provider="paiexp")
for name, conf in SAMPLER_CONFS.items():
    store.store(group="hydra/sweeper/sampler", name=name, node=conf, provider="paiexp")
