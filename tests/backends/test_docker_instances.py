"""Multi-instance jobs on backend=docker: cooperating containers on a network of the job's own.

Against the real engine: the DDP example in the torch test image (tests/images/build-torch.sh),
the other jobs shell commands that meet at files in the shared model channel (an instance
waits for another's file, never for a time). Every test ends with no container and no network
of its root left, checked through the Docker SDK.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, all_runs, clean_env, job_end, mlflow_client, run_paiexp, wait_until
from ddp_helpers import assert_trained_in_step

from paiexp.backends import JobState
from paiexp.backends.docker import JOB_LABEL, ROOT_LABEL, DockerBackend
from paiexp.config.schema import DockerBackendConfig
from paiexp.config.spec import JobSpec

GRACE = 1.0
MODEL = "/ml/output/model"  # in every container: the job's model channel, shared
# Each instance leaves "<rank>.up" in the model channel, then waits for the file named by its
# WAIT_<rank> variable (none: it goes on at once).
MEET = (
    'touch "$PAI_OUTPUT_MODEL/$RANK.up"; '
    'eval wait_for=\\"\\${WAIT_$RANK:-}\\"; '
    'while [ -n "$wait_for" ] && [ ! -e "$wait_for" ]; do sleep 0.02; done; '
)


def engine() -> Any:
    import docker

    return docker.from_env()


def leftovers(root: Path) -> tuple[list[Any], list[Any]]:
    """The containers and networks of a backend root still in the engine."""
    api, label = engine().api, f"{ROOT_LABEL}={root}"
    return api.containers(all=True, filters={"label": label}), api.networks(
        filters={"label": label}
    )


def assert_nothing_left(root: Path) -> None:
    containers, networks = leftovers(root)
    assert containers == [] and networks == [], (containers, networks)


@pytest.fixture(autouse=True)
def remove_leftovers(tmp_path: Path) -> Iterator[None]:
    """A failed test leaves no container or network behind."""
    yield
    api = engine().api
    for container in api.containers(all=True, filters={"label": ROOT_LABEL}):
        if container["Labels"][ROOT_LABEL].startswith(str(tmp_path)):
            api.remove_container(container["Id"], force=True)
    for network in api.networks(filters={"label": ROOT_LABEL}):
        if network["Labels"][ROOT_LABEL].startswith(str(tmp_path)):
            api.remove_network(network["Id"])


def engine_events(root: Path, event: str, since: float) -> list[dict[str, Any]]:
    """The engine's ``event`` (create, start, die) events of ``root``'s containers since then."""
    return list(
        engine().api.events(
            since=since,
            until=time.time() + 0.1,
            filters={"type": "container", "event": event, "label": f"{ROOT_LABEL}={root}"},
            decode=True,
        )
    )


def counts(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["Actor"]["Attributes"]["paiexp.instance"] for e in events)


def make_backend(tmp_path: Path, image: str) -> DockerBackend:
    config = DockerBackendConfig(
        root=str(tmp_path / "jobs"), image=image, poll_interval=0.1, stop_grace_period=GRACE
    )
    return DockerBackend(config, tmp_path)


def both_up(job_dir: Path) -> bool:
    model = job_dir / "ml" / "output" / "model"
    return (model / "0.up").exists() and (model / "1.up").exists()


# -- the DDP example ---------------------------------------------------------------------------


def test_the_ddp_example_trains_in_two_containers_with_identical_parameters(
    tmp_path: Path, torch_image: str
) -> None:
    for name in ("conf", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    done = run_paiexp(
        tmp_path, "job=ddp", "job.hyperparameters.epochs=3", "backend=docker",
        f"backend.image={torch_image}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    root = tmp_path / ".paiexp" / "docker"
    (job_dir,) = (d for d in root.iterdir() if not d.name.startswith("."))
    logs = {
        "master-0": (job_dir / "paiexp" / "job.log").read_text(),
        "worker-0": (job_dir / "instances" / "worker-0" / "paiexp" / "job.log").read_text(),
    }
    assert_trained_in_step(logs)
    assert [p.name for p in (job_dir / "ml" / "output" / "model").iterdir()] == ["model.pt"]

    client = mlflow_client(tmp_path)
    (run,) = all_runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2]
    logged = client.list_artifacts(run.info.run_id, f"logs/{job_dir.name}")
    assert {a.path for a in logged} == {
        f"logs/{job_dir.name}/master-0.log",
        f"logs/{job_dir.name}/worker-0.log",
    }
    worker_log = client.download_artifacts(
        run.info.run_id, f"logs/{job_dir.name}/worker-0.log", str(tmp_path / "downloaded")
    )
    assert Path(worker_log).read_text() == logs["worker-0"]
    assert_nothing_left(root)


# -- one job, whatever its containers ----------------------------------------------------------


def test_a_failing_instance_fails_the_job_naming_it_and_the_other_is_stopped(
    tmp_path: Path, docker_image: str
) -> None:
    since = time.time()
    backend = make_backend(tmp_path, docker_image)
    # the master runs on (deaf to SIGTERM: it takes the grace period's SIGKILL) once the
    # worker is up; the worker fails once the master is up
    command = (
        MEET + 'if [ "$RANK" = 1 ]; then echo "bad shard"; exit 1; fi; '
        "trap '' TERM; while true; do sleep 0.1; done"
    )
    spec = JobSpec(
        name="fails",
        command=command,
        instance_count=2,
        environments={"WAIT_0": f"{MODEL}/1.up", "WAIT_1": f"{MODEL}/0.up"},
    )
    backend.validate(spec)
    status = job_end(backend, backend.submit(spec))

    assert status.state is JobState.FAILED
    assert status.reason == "worker-0 exited with code 1: bad shard"
    assert status.exit_code == 1
    events = engine_events(backend.root, "die", since)
    died = {event["Actor"]["Attributes"]["paiexp.instance"]: event for event in events}
    assert sorted(died) == ["master-0", "worker-0"]
    assert died["worker-0"]["Actor"]["Attributes"]["exitCode"] == "1"
    assert died["master-0"]["Actor"]["Attributes"]["exitCode"] == "137"  # SIGKILLed
    # the master was stopped within the grace period of the worker's exit
    stopped_after = (died["master-0"]["timeNano"] - died["worker-0"]["timeNano"]) / 1e9
    assert stopped_after < GRACE + 2.0
    assert_nothing_left(backend.root)


def test_an_instance_killed_from_outside_is_a_platform_failure(
    tmp_path: Path, docker_image: str
) -> None:
    backend = make_backend(tmp_path, docker_image)
    spec = JobSpec(name="lost", command=MEET + "exec sleep 300", instance_count=2)
    handle = backend.submit(spec)
    wait_until(lambda: both_up(backend.job_dir("lost")), 60, "both instances to start")
    engine().api.kill(f"{backend.container_name('lost')}-worker-0")  # a node gone, say
    status = job_end(backend, handle)
    assert status.state is JobState.FAILED and status.infrastructure  # retried, not the script's
    assert status.reason is not None and status.reason.startswith("worker-0 "), status.reason
    assert "killed from outside paiexp" in status.reason
    assert_nothing_left(backend.root)


def test_stop_stops_every_container(tmp_path: Path, docker_image: str) -> None:
    backend = make_backend(tmp_path, docker_image)
    spec = JobSpec(name="stopped", command=MEET + "exec sleep 300", instance_count=2)
    handle = backend.submit(spec)
    wait_until(lambda: both_up(backend.job_dir("stopped")), 60, "both instances to start")
    backend.stop(handle)
    status = job_end(backend, handle)
    assert status.state is JobState.STOPPED
    assert_nothing_left(backend.root)


def test_max_run_time_holds_for_the_job(tmp_path: Path, docker_image: str) -> None:
    backend = make_backend(tmp_path, docker_image)
    spec = JobSpec(name="long", command="exec sleep 300", instance_count=2, max_run_time=1)
    status = job_end(backend, backend.submit(spec))
    assert status.state is JobState.FAILED
    assert status.reason is not None and status.reason.startswith("exceeded max_run_time of 1 s")
    assert_nothing_left(backend.root)


def test_a_sigkilled_launcher_reattaches_to_every_container_and_starts_none_twice(
    tmp_path: Path, docker_image: str
) -> None:
    since = time.time()
    for name in ("conf", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    # each instance says it is up, then waits for the test's go in the shared channel
    command = f'touch "$PAI_OUTPUT_MODEL/$RANK.up"; until [ -e {MODEL}/go ]; do sleep 0.02; done'
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "-q", "backend=docker", f"backend.image={docker_image}",
         f"job.command='{command}; echo test-auc=0.5'", "job.instance_count=2"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    root = tmp_path / ".paiexp" / "docker"

    def started() -> Path | None:
        jobs = root.glob("xgb-*") if root.exists() else []
        return next((d for d in jobs if both_up(d)), None)

    job_dir = wait_until(started, 60, "both instances to start")

    def held_running() -> bool:
        """Both containers run, held until the go (not given yet)."""
        containers, _ = leftovers(root)
        go = (job_dir / "ml" / "output" / "model" / "go").exists()
        return not go and sorted(c["State"] for c in containers) == ["running"] * 2

    assert held_running()
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    assert held_running()  # they run past the kill

    again = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "attach", job_dir.name, "-q"],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    (job_dir / "ml" / "output" / "model" / "go").touch()
    _, stderr = again.communicate(timeout=120)
    assert again.returncode == 0, stderr
    for event in ("create", "start"):  # each container once
        assert counts(engine_events(root, event, since)) == {"master-0": 1, "worker-0": 1}
    client = mlflow_client(tmp_path)
    (run,) = all_runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test-auc"] == 0.5
    logged = {a.path for a in client.list_artifacts(run.info.run_id, f"logs/{job_dir.name}")}
    assert logged == {f"logs/{job_dir.name}/master-0.log", f"logs/{job_dir.name}/worker-0.log"}
    assert_nothing_left(root)


def test_more_gpus_than_the_engine_has_is_one_line_and_nothing_submitted(
    tmp_path: Path, docker_image: str
) -> None:
    if "nvidia" in engine().info().get("Runtimes", {}):
        pytest.skip("an engine with GPUs: 2 instances of 1 GPU may fit")
    for name in ("conf", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    done = run_paiexp(
        tmp_path, "backend=docker", f"backend.image={docker_image}",
        "job.instance_type=ecs.gn6i-c4g1.xlarge", "job.instance_count=2",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("paiexp: error:")]
    assert line.startswith("paiexp: error: job.instance_count: 2 instances x 1 GPU(s)")
    assert "backend.gpus=0" in line
    assert not (tmp_path / ".paiexp" / "docker").exists()
    assert_nothing_left(tmp_path / ".paiexp" / "docker")


def test_job_label_names_the_job_on_every_container(tmp_path: Path, docker_image: str) -> None:
    backend = make_backend(tmp_path, docker_image)
    spec = JobSpec(name="named", command=MEET + f"until [ -e {MODEL}/go ]; do sleep 0.02; done",
                   instance_count=2)  # fmt: skip
    handle = backend.submit(spec)
    wait_until(lambda: both_up(backend.job_dir("named")), 60, "both instances to start")
    containers, networks = leftovers(backend.root)
    assert sorted(c["Names"][0] for c in containers) == [
        f"/{handle.id}-master-0",
        f"/{handle.id}-worker-0",
    ]
    assert {c["Labels"][JOB_LABEL] for c in containers} == {"named"}
    assert [n["Name"] for n in networks] == [handle.id]
    (backend.job_dir("named") / "ml" / "output" / "model" / "go").touch()
    assert job_end(backend, handle).state is JobState.SUCCEEDED
    assert_nothing_left(backend.root)
