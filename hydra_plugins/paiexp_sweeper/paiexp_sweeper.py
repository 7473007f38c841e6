"""The ``hydra/sweeper=paiexp`` plugin class; its work is paiexp.hydra_launch.sweeper's, loaded
when a sweep starts (Hydra imports this module whenever it scans plugins)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hydra.plugins.sweeper import Sweeper

if TYPE_CHECKING:
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig

    from paiexp.hydra_launch.sweeper import AppSweep


class PaiexpSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.app_sweep: AppSweep | None = None

    def setup(
        self,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        from paiexp.hydra_launch.sweeper import AppSweep

        self.app_sweep = AppSweep(task_function, config)

    def sweep(self, arguments: list[str]) -> Any:
        assert self.app_sweep is not None, "setup() comes first"
        return self.app_sweep.sweep(arguments)
