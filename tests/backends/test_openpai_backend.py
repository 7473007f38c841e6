"""backend=openpai end to end, against the fake OpenPAI cluster of tests/openpai_server: its
rest-server over real HTTP (bearer token, 409 on a duplicate name, the /rest-server prefix,
fault injection), each job's task role a real container of the test image with the storage
bind-mounted at /mnt/<name>. What every backend does is in test_backend_contract.py; this file
keeps what is openpai's own: sweeps, a killed launcher, faults, bad input.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import (
    REPO,
    assert_nothing_started,
    assert_one_line_error,
    clean_env,
    run_paiexp,
    wait_until,
)
from emulator.common import FaultPlan
from gates import Gates
from openpai_server import OpenPaiServer
from sweep_helpers import load_study, sweep_runs, synthetic_project
from test_backend_contract import openpai_config

from paiexp.backends import JobHandle, JobState, JobStatus
from paiexp.backends.openpai import OpenPaiBackend
from paiexp.config.spec import JobSpec
from paiexp.errors import UserError

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


def test_a_twice_killed_launcher_reattaches_and_submits_nothing_twice(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path
) -> None:
    gates = Gates(cluster.storage_dir(STORAGE) / "gates")  # each job runs until its gate opens
    root = synthetic_project(
        tmp_path,
        {"params": {"x": "interval(-1, 1)"}, "n_trials": 6, "parallelism": 2},
        {"environments": {"GATES": f"/mnt/{STORAGE}/gates"}},  # the storage, in its container
    )
    overrides = openpai_overrides(cluster, docker_image)
    command = [sys.executable, "-m", "paiexp", "+sweep=syn", *overrides]
    reattached: set[str] = set()
    held: list[Path] = []
    for _ in range(2):
        launcher = subprocess.Popen(
            command,
            cwd=root,
            env=openpai_env(cluster),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        gates.open(held[:1])  # a slot frees: the relaunch submits a job of its own
        before, held = held, gates.wait_held(2, timeout=180)
        assert set(held) - set(before), "no new job held"
        # kill it while the jobs it submitted (or adopted) run, held
        assert launcher.poll() is None
        running = {j["name"] for j in cluster.jobs() if j["state"] == "RUNNING"}
        assert len(running) == 2 and not running <= reattached
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert sorted(gates.held()) == sorted(held)  # none let end: they run past the kill
        reattached |= running
    with gates.all_open():
        final = run_paiexp(root, "+sweep=syn", *overrides, env=openpai_env(cluster))
    assert final.returncode == 0, final.stderr[-3000:]

    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    names = {t.user_attrs["paiexp:job_name"] for t in study.trials}
    assert cluster.submissions == Counter(dict.fromkeys(names, 1))  # none submitted twice
    assert reattached <= names
    assert {j["state"] for j in cluster.jobs()} == {"SUCCEEDED"}
    parents, children = sweep_runs(root)
    assert len(children) == 6 and {c.info.status for c in children} == {"FINISHED"}
    assert parents[0].info.status == "FINISHED"
    assert cluster.containers() == []


def test_a_sweep_rides_out_injected_faults(docker_image: str, tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path,
        {"params": {"x": "interval(-1, 1)", "duration": 0.5}, "n_trials": 6, "parallelism": 2},
    )
    # a cluster serving the API at its root (no /rest-server prefix), one request in five failing
    with OpenPaiServer(tmp_path / "openpai", prefix="") as server:
        server.faults = FaultPlan(rate=0.2, kinds=("error", "drop"), seed=1)
        overrides = [
            *openpai_overrides(server, docker_image),
            f"backend.rest_server_uri={server.uri}",
        ]
        result = run_paiexp(root, "+sweep=syn", *overrides, env=openpai_env(server))
        server.faults = FaultPlan()
        assert result.returncode == 0, result.stderr[-3000:]
        faults = Counter(r.fault for r in server.records() if r.fault)
        requests = len(server.records())
        assert sum(faults.values()) >= 0.1 * requests and set(faults) == {"error", "drop"}, (
            faults,
            requests,
        )
        study = load_study(root)
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
        names = {t.user_attrs["paiexp:job_name"] for t in study.trials}
        assert server.submissions == Counter(dict.fromkeys(names, 1))  # no job created twice
        parents, children = sweep_runs(root)
        assert len(parents) == 1 and len(children) == 6
        assert {c.info.status for c in children} == {"FINISHED"}
        assert server.containers() == []


def finish(backend: OpenPaiBackend, handle: JobHandle) -> JobStatus:
    """Poll until the job has ended; its final status."""

    def ended() -> JobStatus | None:
        status = backend.poll([handle])[handle.id]
        return status if status.state.terminal else None

    return wait_until(ended, 60, f"job {handle.name} to end", interval=0.1)


def test_a_job_the_cluster_cannot_start_fails_with_its_exit_diagnostics(
    cluster: OpenPaiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENPAI_TOKEN", cluster.token)
    backend = OpenPaiBackend(openpai_config(cluster, cpus=1), tmp_path)
    spec = JobSpec("no-image", "true", image="paiexp-test/no-such:1", instance_type="ecs.c6.large")
    status = finish(backend, backend.submit(spec))
    assert status.state is JobState.FAILED and not status.infrastructure
    assert status.reason == (
        "OpenPAI FAILED (exit code 254, ContainerImageNotExists): Pull access denied for "
        "paiexp-test/no-such:1, repository does not exist"
    )
    assert cluster.containers() == []


def test_a_cluster_alias_of_openpaisdk_gives_the_uri_user_and_token(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".openpai").mkdir()
    alias = {"cluster_alias": "fake", "pai_uri": cluster.uri, "user": cluster.user}
    clusters = [
        {"cluster_alias": "other", "pai_uri": "http://x"},
        {**alias, "token": cluster.token},
    ]
    (tmp_path / ".openpai" / "clusters.yaml").write_text(yaml.safe_dump(clusters))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("OPENPAI_TOKEN", raising=False)
    config = openpai_config(cluster, cpus=1, cluster_alias="fake")
    config.rest_server_uri = config.user = None  # from the alias: pai_uri + /rest-server
    backend = OpenPaiBackend(config, tmp_path)
    spec = JobSpec("aliased", "true", image=docker_image, instance_type="ecs.c6.large")
    backend.validate(spec)
    handle = backend.submit(spec)
    assert finish(backend, handle).state is JobState.SUCCEEDED
    assert cluster.submissions == Counter({"aliased": 1})
    assert backend.console_url(handle) == (
        f"{cluster.uri}/job-detail.html?username={cluster.user}&jobName=aliased"
    )
    with urllib.request.urlopen(backend.console_url(handle)) as page:  # the portal's page
        assert page.status == 200

    config.cluster_alias = "nope"
    with pytest.raises(
        UserError, match=r"^backend\.cluster_alias: unknown alias 'nope'; .*: fake, other$"
    ):
        OpenPaiBackend(config, tmp_path)


def test_secret_environments_travel_as_the_protocols_secrets(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENPAI_TOKEN", cluster.token)
    backend = OpenPaiBackend(openpai_config(cluster, cpus=1), tmp_path)
    secret, plain = "s3cr3t 'quoted' $value", "a plain value"
    command = (
        'printf %s "$MY_TOKEN" > "$PAI_OUTPUT_MODEL/secret"; '
        'printf %s "$PLAIN" > "$PAI_OUTPUT_MODEL/plain"'
    )
    spec = JobSpec(
        name="secrets",
        command=command,
        image=docker_image,
        instance_type="ecs.c6.large",
        environments={"MY_TOKEN": secret, "PLAIN": plain},
    )
    backend.validate(spec)
    handle = backend.submit(spec)
    status = finish(backend, handle)
    assert status.state is JobState.SUCCEEDED, (status, backend.read_logs(handle, 0, final=True))
    model = Path(backend.outputs(handle)["model"].removeprefix("file://"))
    assert (model / "secret").read_text() == secret
    assert (model / "plain").read_text() == plain
    protocol = cluster.protocol("secrets")
    assert set(protocol["secrets"]) == {"MY_TOKEN"}
    assert secret not in yaml.safe_dump({k: v for k, v in protocol.items() if k != "secrets"})
    staged = cluster.storage_dir(STORAGE) / "paiexp" / "jobs" / "secrets"
    for path in staged.rglob("*"):  # spec.json holds a reference, not the value
        if path.is_file() and path.parent != model:
            assert secret.encode() not in path.read_bytes(), path


# -- bad input: one line, exit code 2, nothing started, no job submitted -----------------------

BAD_INPUT = {
    "bad-token": ((), "wrong-token-0123456789", ("OPENPAI_TOKEN", "401", "UnauthorizedUserError")),
    "no-token": ((), "", ("OPENPAI_TOKEN", "backend.cluster_alias")),
    "unknown-virtual-cluster": (
        ("backend.virtual_cluster=nope",),
        None,
        ("backend.virtual_cluster", "'nope'", "default, gpu"),
    ),
    "missing-storage-config": (
        ("backend.storage.name=null",),
        None,
        ("backend.storage.name", "required"),
    ),
    "unknown-storage-config": (
        ("backend.storage.name=nope",),
        None,
        ("backend.storage.name", "'nope'", "confignfs"),
    ),
    "missing-local-storage": (
        ("backend.storage.local_path=/no/such/mount",),
        None,
        ("backend.storage.local_path", "/no/such/mount"),
    ),
    "unknown-instance-type": (
        ("job.instance_type=ecs.nope.large",),
        None,
        ("job.instance_type", "ecs.nope.large", "backend=openpai", "ecs.c6.large"),
    ),
    "image-missing": (("backend.image=null",), None, ("job.image", "backend=openpai")),
}


@pytest.mark.parametrize("case", list(BAD_INPUT), ids=list(BAD_INPUT))
def test_bad_input_is_one_line_and_submits_nothing(
    cluster: OpenPaiServer, docker_image: str, tmp_path: Path, case: str
) -> None:
    extra, token, mentions = BAD_INPUT[case]
    root = project(tmp_path / "project")
    overrides = [*openpai_overrides(cluster, docker_image), *extra]
    env = openpai_env(cluster)
    if token is not None:
        env["OPENPAI_TOKEN"] = token
    result = run_paiexp(root, "+sweep=xgb", *overrides, env=env)
    line = assert_one_line_error(result)
    for text in mentions:
        assert text in line, f"{text!r} not in {line!r}"
    assert_nothing_started(root)
    assert not cluster.submissions and not cluster.records("SubmitJob")
    assert_token_nowhere(cluster, root, output=result.stderr)
    if token:
        assert token not in result.stderr
