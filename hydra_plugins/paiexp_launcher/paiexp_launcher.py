"""The ``hydra/launcher=paiexp`` plugin class; its work is paiexp.hydra_launch.launcher's,
loaded when a multirun launches (Hydra imports this module whenever it scans plugins)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hydra.plugins.launcher import Launcher

if TYPE_CHECKING:
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext, TaskFunction
    from omegaconf import DictConfig

    from paiexp.hydra_launch.launcher import MultirunLauncher


class PaiexpLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        self.multirun: MultirunLauncher | None = None

    def setup(
        self,
        *,
        hydra_context: HydraContext,
        task_function: TaskFunction,
        config: DictConfig,
    ) -> None:
        from paiexp.hydra_launch.launcher import MultirunLauncher

        self.multirun = MultirunLauncher(hydra_context, task_function, config)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        assert self.multirun is not None, "setup() comes first"
        return self.multirun.launch(job_overrides, initial_job_idx)
