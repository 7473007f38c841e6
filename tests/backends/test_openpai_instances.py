"""Multi-instance jobs on backend=openpai: a task role of 2 tasks on the fake OpenPAI cluster
(its rest-server over real HTTP, each task a real container on a network of the job).

The tasks meet over TCP, or at files on the shared storage (a barrier: a task waits for
another's file or the test's, never for a time). The DDP example needs PyTorch in the
containers: its image comes from :func:`torch_image` alone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import docker
import pytest
from conftest import all_runs, mlflow_client, run_paiexp, wait_until
from ddp_helpers import assert_trained_in_step
from openpai_server import OpenPaiServer
from openpai_server.cluster import LABEL
from openpai_server.taskrole import Completion
from test_backend_contract import openpai_config
from test_openpai_backend import (
    STORAGE,
    assert_token_nowhere,
    cluster_for,
    finish,
    openpai_env,
    openpai_overrides,
    project,
)

from paiexp.backends import JobHandle, JobState
from paiexp.backends.openpai import OpenPaiBackend
from paiexp.backends.openpai_distributed import exports
from paiexp.config.spec import JobSpec
from paiexp.contract.distributed import TF_JOB, Topology

# Each task leaves "<rank>.up" in the model channel (one directory on the storage for the
# job's tasks), then waits for the file its WAIT_<rank> variable names (none: it goes on).
MEET = (
    'touch "$PAI_OUTPUT_MODEL/$RANK.up"; '
    'eval wait_for=\\"\\${WAIT_$RANK:-}\\"; '
    'while [ -n "$wait_for" ] && [ ! -e "$wait_for" ]; do sleep 0.02; done; '
)
# The worker connects to the master (which may not listen yet: it tries again until it
# does) and each tells the other its RANK; both print what they were given and got.
EXCHANGE = """\
import os, socket, time

rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "GLOO_SOCKET_IFNAME")
print("contract " + " ".join(f"{n}={os.environ[n]}" for n in names), flush=True)
if rank == "0":
    with socket.create_server(("", master[1])) as server:
        peer, _ = server.accept()
else:
    while True:
        try:
            peer = socket.create_connection(master, timeout=30)
            break
        except OSError:  # refused: the master does not listen yet
            time.sleep(0.05)
with peer:
    peer.sendall(rank.encode() + b"\\n")
    got = peer.makefile().readline().strip()
print(f"rank {rank} got rank {got}", flush=True)
print(f"peer_rank={got}", flush=True)
"""
JOB = {
    "name": "meet",
    "command": "python exchange.py",
    "source_dir": "exchange",
    "instance_type": "ecs.c6.large",
    "instance_count": 2,
    "max_run_time": 300,
    "metric_definitions": [{"name": "peer_rank", "regex": r"^peer_rank=(\d+)"}],
}


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> OpenPaiServer:
    return cluster_for(request)


def exchange_project(root: Path) -> Path:
    project(root)
    (root / "exchange").mkdir()
    (root / "exchange" / "exchange.py").write_text(EXCHANGE)
    (root / "conf" / "job" / "meet.yaml").write_text(json.dumps(JOB))
    return root


def assert_nothing_left(cluster: OpenPaiServer) -> None:
    """No container nor network of the cluster is left (the Docker engine says so)."""
    engine = docker.from_env()
    label = {"label": f"{LABEL}={cluster.label}"}
    assert engine.containers.list(all=True, filters=label) == []
    assert engine.networks.list(filters=label) == []


def logged_instance_logs(root: Path, job: str) -> dict[str, str]:
    """The instances' logs the job's MLflow run holds (``logs/<job>/``), by instance."""
    client = mlflow_client(root)
    (run,) = all_runs(root)
    logs = {}
    for artifact in client.list_artifacts(run.info.run_id, f"logs/{job}"):
        path = client.download_artifacts(run.info.run_id, artifact.path, str(root / "got"))
        logs[Path(artifact.path).stem] = Path(path).read_text()
    return logs


@pytest.mark.parametrize("job_type", ["PyTorchJob", TF_JOB])
def test_each_task_exports_what_paiexp_distributed_gives_its_rank(job_type: str) -> None:
    topology = Topology(3, job_type, gpus=2)
    addresses = [("10.0.0.2", 20001), ("10.0.0.3", 30002), ("10.0.0.4", 40003)]
    openpai = {f"PAI_HOST_IP_train_{i}": host for i, (host, _) in enumerate(addresses)}
    openpai |= {f"PAI_PORT_LIST_train_{i}_dist": str(port) for i, (_, port) in enumerate(addresses)}
    script = "\n".join(["set -eu", *exports("train", topology), "env"])
    for rank in range(3):
        task = {
            **openpai,
            "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(rank),
            "PATH": "/usr/bin:/bin",
        }
        shown = subprocess.run(
            ["sh", "-c", script], env=task, capture_output=True, text=True, check=True
        )
        env = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
        expected = {**topology.environment(rank, addresses), "GLOO_SOCKET_IFNAME": "eth0"}
        assert {name: env[name] for name in expected} == expected
        assert ("TF_CONFIG" in env) == (job_type == TF_JOB)


def test_the_fake_clusters_completion_policy_is_frameworkcontrollers() -> None:
    default = Completion()  # minFailedInstances 1, minSucceededInstances -1
    assert default.verdict({1: 0}, 2) is None
    assert default.verdict({1: 0, 0: 0}, 2) == (
        True,
        "All Tasks are completed and no completion policy was triggered",
    )
    assert default.verdict({1: 1}, 2) == (
        False,
        "FailedTaskCount 1 has reached MinFailedTaskCount 1",
    )
    lenient = Completion.of({"completion": {"minFailedInstances": -1, "minSucceededInstances": 1}})
    assert lenient.verdict({0: 3}, 3) is None  # a failure never fails it
    assert lenient.verdict({0: 3, 2: 0}, 3) == (
        True,
        "SucceededTaskCount 1 has reached MinSucceededTaskCount 1",
    )
    assert Completion.of({"completion": {"minFailedInstances": -1}}).verdict({0: 1, 1: 1}, 2)[0]


def test_two_tasks_meet_over_tcp_with_the_distributed_contract(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path
) -> None:
    root = exchange_project(tmp_path / "project")
    overrides = openpai_overrides(cluster, docker_image)
    done = run_paiexp(root, "job=meet", *overrides, env=openpai_env(cluster))
    assert done.returncode == 0, done.stderr[-3000:]

    (run,) = all_runs(root)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["peer_rank"] == 1  # from the master's log
    (job,) = cluster.jobs()
    logs = logged_instance_logs(root, job["name"])
    assert sorted(logs) == ["master-0", "worker-0"]
    assert "rank 0 got rank 1" in logs["master-0"]
    assert "rank 1 got rank 0" in logs["worker-0"]
    tasks = cluster.job(job["name"])["taskRoles"]["train"]["taskStatuses"]
    assert [t["taskState"] for t in tasks] == ["SUCCEEDED", "SUCCEEDED"]
    port = cluster.protocol(job["name"])["taskRoles"]["train"]["resourcePerInstance"]["ports"]
    assert port == {"dist": 1}
    for rank, name in enumerate(["master-0", "worker-0"]):
        (line,) = [x for x in logs[name].splitlines() if x.startswith("contract ")]
        seen = dict(item.split("=", 1) for item in line.split()[1:])
        assert seen.pop("MASTER_PORT").isdigit()
        assert seen == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": tasks[0]["containerIp"],  # task 0's address on the job's network
            "NPROC_PER_NODE": "1",
            "GLOO_SOCKET_IFNAME": "eth0",
        }
    assert cluster.submissions == Counter({job["name"]: 1})
    assert_nothing_left(cluster)
    assert_token_nowhere(cluster, root, cluster.storage_dir(STORAGE), output=done.stderr)


def submit(
    cluster: OpenPaiServer, tmp_path: Path, spec: JobSpec
) -> tuple[OpenPaiBackend, JobHandle]:
    backend = OpenPaiBackend(openpai_config(cluster, poll_interval=0.1, cpus=1), tmp_path)
    backend.validate(spec)
    return backend, backend.submit(spec)


def up(cluster: OpenPaiServer, job: str, rank: int) -> Path:
    return (
        cluster.storage_dir(STORAGE)
        / "paiexp"
        / "jobs"
        / job
        / "ml"
        / "output"
        / "model"
        / f"{rank}.up"
    )


def test_a_failing_task_fails_the_job_naming_it_and_the_other_is_stopped(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENPAI_TOKEN", cluster.token)
    # the master runs on (deaf to SIGTERM: the stop's SIGKILL ends it) once the worker is up;
    # the worker fails once the master is up
    command = (
        MEET + 'if [ "$RANK" = 1 ]; then echo "bad shard"; exit 1; fi; '
        "trap '' TERM; while true; do sleep 0.1; done"
    )
    model = "/ml/output/model"
    spec = JobSpec(
        name="fails",
        command=command,
        image=docker_image,
        instance_type="ecs.c6.large",
        instance_count=2,
        environments={"WAIT_0": f"{model}/1.up", "WAIT_1": f"{model}/0.up"},
    )
    backend, handle = submit(cluster, tmp_path, spec)
    status = finish(backend, handle)

    assert status.state is JobState.FAILED
    assert status.reason == "worker-0 exited with code 1: bad shard"
    tasks = cluster.job("fails")["taskRoles"]["train"]["taskStatuses"]
    assert [(t["taskState"], t["containerExitCode"]) for t in tasks] == [
        ("STOPPED", -220),  # stopped as the completion policy ended the attempt
        ("FAILED", 1),
    ]
    assert cluster.job("fails")["jobStatus"]["appExitTriggerTaskIndex"] == 1
    logs = backend.instance_logs(handle)
    assert logs["worker-0"].read_text() == "bad shard\n"
    assert up(cluster, "fails", 0).exists() and up(cluster, "fails", 1).exists()
    assert_nothing_left(cluster)


def test_stop_stops_every_task(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENPAI_TOKEN", cluster.token)
    spec = JobSpec(
        name="stopped",
        command=MEET + "exec sleep 300",
        image=docker_image,
        instance_type="ecs.c6.large",
        instance_count=2,
    )
    backend, handle = submit(cluster, tmp_path, spec)
    wait_until(
        lambda: up(cluster, "stopped", 0).exists() and up(cluster, "stopped", 1).exists(),
        60,
        "both tasks to start",
    )
    backend.stop(handle)
    assert finish(backend, handle).state is JobState.STOPPED
    tasks = cluster.job("stopped")["taskRoles"]["train"]["taskStatuses"]
    assert [t["taskState"] for t in tasks] == ["STOPPED", "STOPPED"]
    assert_nothing_left(cluster)


def test_max_run_time_holds_for_the_job(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENPAI_TOKEN", cluster.token)
    spec = JobSpec(
        name="slow",
        command="exec sleep 300",
        image=docker_image,
        instance_type="ecs.c6.large",
        instance_count=2,
        max_run_time=1,
    )
    backend, handle = submit(cluster, tmp_path, spec)
    status = finish(backend, handle)
    assert status.state is JobState.FAILED
    assert status.reason == "exceeded max_run_time of 1 s"
    assert_nothing_left(cluster)


def test_a_sigkilled_launcher_reattaches_to_every_task_and_submits_nothing_twice(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path
) -> None:
    root = project(tmp_path / "project")
    storage = cluster.storage_dir(STORAGE)
    go = storage / "go"
    # each task says it is up, then waits for the test's go (on the storage)
    command = (
        f'touch "$PAI_OUTPUT_MODEL/$RANK.up"; '
        f"while [ ! -e /mnt/{STORAGE}/go ]; do sleep 0.02; done; echo test-auc=0.5"
    )
    launch = [
        *(sys.executable, "-m", "paiexp", "-q"),
        *openpai_overrides(cluster, docker_image),
        f"job.command='{command}'",
        "job.instance_count=2",
    ]
    launcher = subprocess.Popen(
        launch,
        cwd=root,
        env=openpai_env(cluster),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def started() -> str | None:
        jobs = [j["name"] for j in cluster.jobs()]
        return next(
            (j for j in jobs if up(cluster, j, 0).exists() and up(cluster, j, 1).exists()), None
        )

    job = wait_until(started, 120, "both tasks to start")

    def held_running() -> bool:
        """The job runs, its tasks held until the go (not given yet)."""
        states = [j["state"] for j in cluster.jobs() if j["name"] == job]
        return not go.exists() and states == ["RUNNING"]

    assert held_running()
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert held_running()  # it runs past the kill

    again = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "attach", job, "-q"],
        cwd=root,
        env=openpai_env(cluster),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    go.touch()
    _, stderr = again.communicate(timeout=120)
    assert again.returncode == 0, stderr[-3000:]
    assert cluster.submissions == Counter({job: 1})
    (run,) = all_runs(root)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test-auc"] == 0.5
    assert sorted(logged_instance_logs(root, job)) == ["master-0", "worker-0"]
    assert_nothing_left(cluster)


@pytest.mark.timeout(600)
def test_the_ddp_example_trains_on_two_tasks_with_identical_parameters(
    cluster: OpenPaiServer, torch_image: str, tmp_path: Path
) -> None:
    root = project(tmp_path / "project")
    overrides = [
        *openpai_overrides(cluster, torch_image),
        "job=ddp",
        "job.hyperparameters.epochs=3",
    ]
    done = run_paiexp(root, *overrides, env=openpai_env(cluster), timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]

    (job,) = cluster.jobs()
    logs = logged_instance_logs(root, job["name"])
    assert_trained_in_step(logs)
    model = (
        cluster.storage_dir(STORAGE) / "paiexp" / "jobs" / job["name"] / "ml" / "output" / "model"
    )
    assert [p.name for p in model.iterdir()] == ["model.pt"]
    client = mlflow_client(root)
    (run,) = all_runs(root)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2]
    assert_nothing_left(cluster)
