"""The command line's options for running one job on each backend: local, docker, pai (the
session's emulator), openpai (a fake cluster), so a scenario can run unchanged on all four."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from conftest import clean_env

BACKENDS = [
    pytest.param("local"),
    pytest.param("docker", marks=pytest.mark.docker),
    pytest.param("pai", marks=pytest.mark.slow),
    pytest.param("openpai", marks=pytest.mark.docker),
]


@dataclass(frozen=True)
class CliBackend:
    """A backend as the command line selects it: its overrides and its environment."""

    name: str
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=clean_env)


@pytest.fixture(params=BACKENDS)
def cli_backend(request: pytest.FixtureRequest) -> CliBackend:
    if request.param == "docker":
        image = request.getfixturevalue("docker_image")
        return CliBackend("docker", ["backend=docker", f"backend.image={image}"])
    if request.param == "pai":
        from test_pai_backend import pai_env, pai_overrides

        cloud = request.getfixturevalue("pai_cloud")
        return CliBackend("pai", pai_overrides(cloud), pai_env(cloud))
    if request.param == "openpai":  # a fake OpenPAI cluster of the test's own
        from test_openpai_backend import cluster_for, openpai_env, openpai_overrides

        server = cluster_for(request)
        image = request.getfixturevalue("docker_image")
        return CliBackend("openpai", openpai_overrides(server, image), openpai_env(server))
    return CliBackend("local")
