"""Preemption on every backend: a sweep of a script that checkpoints each epoch, whose jobs are
taken away mid-epoch from outside (PAI reclaims spot instances, a container is killed, a job's
processes are killed), completes every trial from its checkpoints without counting a failure.
Each preemption waits for the job's own ``held`` file: no sleeps decide anything."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulator import Emulator
from preemption_helpers import assert_resumed, epochs_project, sweep_preempting
from sweep_helpers import jobs_dir
from test_pai_backend import pai_env, pai_overrides

from paiexp.util.jsonfiles import read_json

pytestmark = pytest.mark.slow

LEDGER = Path("ml", "output", "ledger")


def ledgers_under(root: Path) -> dict[str, Path]:
    """Each job directory's ledger channel, by job name."""
    return {d.name: d / LEDGER for d in root.iterdir()} if root.exists() else {}


def held_under(root: Path) -> Iterator[tuple[str, Path]]:
    for name, ledger in ledgers_under(root).items():
        if (ledger / "held").exists():
            yield name, ledger


def test_killed_local_jobs_resume_from_their_checkpoints(tmp_path: Path) -> None:
    root = epochs_project(tmp_path)

    def kill(name: str, ledger: Path) -> None:
        state = read_json(jobs_dir(root) / name / "state.json")
        os.kill(state["runner_pid"], signal.SIGKILL)  # first: it records no end of its own
        os.killpg(state["pgid"], signal.SIGKILL)

    done = sweep_preempting(root, [], lambda: held_under(jobs_dir(root)), kill)
    assert_resumed(root, done, ledgers_under(jobs_dir(root)), "the job's runner process died")


def test_containers_killed_from_outside_resume_from_their_checkpoints(
    tmp_path: Path, docker_image: str
) -> None:
    import docker

    root = epochs_project(tmp_path)
    jobs = root / ".paiexp" / "docker"
    client = docker.from_env()

    def kill(name: str, ledger: Path) -> None:
        client.api.kill((ledger / "held").read_text().strip())

    overrides = ["backend=docker", f"backend.image={docker_image}"]
    done = sweep_preempting(root, overrides, lambda: held_under(jobs), kill)
    assert_resumed(root, done, ledgers_under(jobs), "killed from outside paiexp")


def test_openpai_tasks_killed_from_outside_resume_from_their_checkpoints(
    tmp_path: Path, docker_image: str
) -> None:
    import docker
    from openpai_server import OpenPaiServer
    from test_openpai_backend import STORAGE, openpai_env, openpai_overrides

    root = epochs_project(tmp_path / "project")
    with OpenPaiServer(tmp_path / "openpai") as cluster:
        jobs = cluster.storage_dir(STORAGE) / "paiexp" / "jobs"
        client = docker.from_env()

        def kill(name: str, ledger: Path) -> None:  # the task's container, by its host name
            client.api.kill((ledger / "held").read_text().strip())

        overrides = openpai_overrides(cluster, docker_image)
        done = sweep_preempting(
            root, overrides, lambda: held_under(jobs), kill, openpai_env(cluster)
        )
        assert_resumed(root, done, ledgers_under(jobs), "ContainerSigKillReceived")


def test_reclaimed_spot_jobs_resume_from_their_checkpoints(tmp_path: Path) -> None:
    root = epochs_project(tmp_path / "project")
    with Emulator(tmp_path / "cloud") as cloud:

        def ledgers() -> dict[str, tuple[str, Path]]:
            return {
                job["TrainingJobName"]: (
                    job["TrainingJobId"],
                    cloud.pai.job_dir(job["TrainingJobId"]) / LEDGER,
                )
                for job in cloud.pai.jobs()
            }

        def held() -> Iterator[tuple[str, Path]]:
            for job_id, ledger in ledgers().values():
                if (ledger / "held").exists():
                    yield job_id, ledger

        overrides = [*pai_overrides(cloud), "backend.spot.strategy=SpotAsPriceGo"]
        done = sweep_preempting(
            root, overrides, held, lambda job_id, _: cloud.pai.reclaim(job_id), pai_env(cloud)
        )
        found = {name: ledger for name, (_, ledger) in ledgers().items()}
        reclaimed = [j for j in cloud.pai.jobs() if j.get("ReasonCode") == "SpotInstanceReleased"]
        assert len(reclaimed) == 3 and all(j["Status"] == "Failed" for j in reclaimed)
        assert_resumed(root, done, found, "SpotInstanceReleased")
        for job in cloud.pai.jobs():  # a re-run's checkpoints channel is the lost job's
            channels = {c["Name"]: c["OutputUri"] for c in job["OutputChannels"]}
            if job not in reclaimed:
                assert channels["checkpoints"] in {
                    c["OutputUri"] for j in reclaimed for c in j["OutputChannels"]
                }


def test_a_lost_single_run_reruns_from_its_checkpoints(tmp_path: Path) -> None:
    """``paiexp rerun RUN_ID --resume``: a single run whose job was lost runs again from the
    checkpoints it left, not from its first epoch."""
    import subprocess
    import sys

    from conftest import all_runs, clean_env, run_paiexp, wait_until
    from preemption_helpers import EPOCHS, HOLD

    root = epochs_project(tmp_path)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp"], cwd=root, env=clean_env(), stderr=subprocess.DEVNULL
    )
    (name, _), *_ = wait_until(lambda: list(held_under(jobs_dir(root))), 120, "held")
    state = read_json(jobs_dir(root) / name / "state.json")
    os.kill(state["runner_pid"], signal.SIGKILL)
    os.killpg(state["pgid"], signal.SIGKILL)
    assert launcher.wait(timeout=120) != 0
    (lost,) = all_runs(root)
    assert lost.info.status == "FAILED"

    done = run_paiexp(root, "rerun", lost.info.run_id, "--resume")
    assert done.returncode == 0, done.stderr
    (rerun,) = [r for r in all_runs(root) if r.data.tags.get("paiexp.rerun_of")]
    resumed = ledgers_under(jobs_dir(root))[rerun.data.tags["paiexp.job_name"]]
    assert resumed.joinpath("epochs").read_text().split() == [
        str(e) for e in range(HOLD + 1, EPOCHS + 1)
    ]  # after the last checkpoint, to the end
    assert rerun.data.metrics["score"] == 0.0


def test_resuming_a_run_that_left_no_checkpoints_is_one_line(tmp_path: Path) -> None:
    from conftest import all_runs, assert_one_line_error, mlflow_client, run_paiexp
    from sweep_helpers import synthetic_project

    root = synthetic_project(tmp_path, {"params": {}}, {"hyperparameters": {"duration": 0.1}})
    assert run_paiexp(root).returncode == 0
    (run,) = all_runs(root)
    # a run that names no checkpoints (a job that never ended, a run made elsewhere)
    mlflow_client(root).delete_tag(run.info.run_id, "paiexp.output.checkpoints")
    line = assert_one_line_error(run_paiexp(root, "rerun", run.info.run_id, "--resume"))
    assert "--resume" in line and "no checkpoints channel" in line, line
    assert len(all_runs(root)) == 1
