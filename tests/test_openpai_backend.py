"""backend=openpai end to end, against the fake OpenPAI cluster of tests/openpai_server: its
rest-server over real HTTP (bearer token, 409 on a duplicate name, the /rest-server prefix,
fault injection), each job's task role a real container of the test image with the storage
bind-mounted at /mnt/<name>. What every backend does is in test_backend_contract.py; this file
keeps what is openpai's own: sweeps, a killed launcher, faults, bad input.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, clean_env, run_paiexp
from openpai_server import OpenPaiServer
from sweep_helpers import load_study, sweep_runs

STORAGE = "confignfs"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[OpenPaiServer]:
    with OpenPaiServer(tmp_path / "openpai") as server:
        yield server


def cluster_for(request: pytest.FixtureRequest) -> OpenPaiServer:
    """A fake cluster for one test (started now, stopped at its end)."""
    server = OpenPaiServer(request.getfixturevalue("tmp_path") / "openpai").start()
    request.addfinalizer(server.stop)
    return server


def openpai_env(server: OpenPaiServer, token: str | None = None) -> dict[str, str]:
    return clean_env(OPENPAI_TOKEN=token or server.token)


def openpai_overrides(server: OpenPaiServer, image: str, poll: float = 0.3) -> list[str]:
    return [
        "backend=openpai",
        f"backend.rest_server_uri={server.rest_server_uri}",
        f"backend.user={server.user}",
        f"backend.storage.name={STORAGE}",
        f"backend.storage.local_path={server.storage_dir(STORAGE)}",
        f"backend.image={image}",
        f"backend.poll_interval={poll}",
        "backend.log_interval=0.5",
        "backend.retry.base_delay=0.05",
        "backend.retry.max_delay=0.5",
        "job.instance_type=ecs.c6.large",
        "backend.cpus=1",  # this machine's 2 cores run two jobs at once (OpenMP threads: 1)
    ]


def project(root: Path) -> Path:
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, root / name)
    return root


def assert_token_nowhere(server: OpenPaiServer, *places: Path, output: str = "") -> None:
    """The token is in no file paiexp wrote (project, storage) nor in its output."""
    assert server.token not in output
    for place in places:
        for path in place.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert server.token.encode() not in path.read_bytes(), path


@pytest.mark.timeout(400)
def test_xgb_sweep_on_openpai(cluster: OpenPaiServer, docker_image: str, tmp_path: Path) -> None:
    root = project(tmp_path / "project")
    result = run_paiexp(
        root,
        "+sweep=xgb",
        "sweep.n_trials=4",
        *openpai_overrides(cluster, docker_image),
        env=openpai_env(cluster),
        timeout=360,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    study = load_study(root, "xgb")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    parents, children = sweep_runs(root)
    assert len(parents) == 1 and len(children) == 4
    storage = cluster.storage_dir(STORAGE)
    for child in children:
        tags = child.data.tags
        assert child.data.metrics["test-auc"] > 0.9
        job = tags["paiexp.job_name"]
        model = storage / "paiexp" / "jobs" / job / "ml" / "output" / "model"
        assert tags["paiexp.model_uri"] == model.as_uri()
        assert (model / "model.json").stat().st_size > 1000
        assert tags["paiexp.console_url"] == (
            f"{cluster.uri}/job-detail.html?username={cluster.user}&jobName={job}"
        )
    names = {t.user_attrs["paiexp:job_name"] for t in study.trials}
    assert cluster.submissions == Counter(dict.fromkeys(names, 1))
    assert {j["state"] for j in cluster.jobs()} == {"SUCCEEDED"}
    # the inputs were staged once for the four jobs; each job's code and config once
    assert len(list((storage / "paiexp" / "inputs").iterdir())) == 2
    assert cluster.containers() == []
    assert_token_nowhere(cluster, root, storage, output=result.stdout + result.stderr)
