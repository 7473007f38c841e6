"""``hydra/launcher=paiexp`` as Hydra's own plugins are tested: Hydra's launcher test suites
(its task functions shipped by value, its apps run again from their files) on backend=local."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.singleton import Singleton
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.version import VersionBase
from image_tags import hydra_image_tag

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command


@pytest.fixture(autouse=True)
def _as_in_a_fresh_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's launcher in a directory of its own (its code snapshot, its MLflow store),
    and Hydra's version base unset, as in the fresh process Hydra's suites assume: paiexp's
    own composition in this process (``version_base="1.3"``) would have turned off the
    change of working directory those suites expect of an app that names none."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(Singleton._instances, VersionBase, raising=False)


@pytest.mark.parametrize("launcher_name, overrides", [("paiexp", [])])
class TestPaiexpLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/launcher=paiexp"])])
class TestPaiexpLauncherIntegration(IntegrationTestSuite):
    pass


@pytest.mark.usefixtures("hydra_image")
@pytest.mark.parametrize(
    "launcher_name, overrides",
    [
        (
            "paiexp",
            ["hydra.launcher.backend=docker", f"hydra.launcher.job.image={hydra_image_tag()}"],
        )
    ],
)
class TestPaiexpLauncherOnDocker(LauncherTestSuite):
    """A subset on backend=docker: task functions (a closure, a resolver registered in the
    test) shipped by value into containers that have Hydra but no paiexp, their outputs
    fetched back."""

    test_sweep_1_job_strict = None  # as test_sweep_1_job, there
    test_sweep_2_optimizers = None  # as test_sweep_2_jobs: two group options
    test_sweep_over_unspecified_mandatory_default = None  # composition: here, as on local
    test_not_sweeping_hydra_overrides = None  # refused by Hydra before any launcher runs
