"""backend=docker against a real Docker engine and the test image of tests/images/build.sh.

Without an engine or the image these tests fail (never skip, in CI or anywhere): deselect them
explicitly with ``-m 'not docker'``. What every backend does (idempotent submit, log cursor,
stop, max_run_time, outputs, label, validate) is in test_backend_contract.py; this file keeps
what is docker's own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from conftest import (
    REPO,
    all_runs,
    assert_nothing_started,
    assert_stays,
    clean_env,
    job_end,
    run_paiexp,
    run_without_heavy_imports,
    wait_until,
)
from gates import Gates
from sweep_helpers import load_study, sweep_runs, synthetic_project
from test_contract_probe import assert_contract_seen, write_probe_project

from paiexp.backends import JobHandle, JobState
from paiexp.backends.docker import JOB_LABEL, ROOT_LABEL, DockerBackend
from paiexp.config.schema import DockerBackendConfig
from paiexp.config.spec import JobSpec
from paiexp.errors import UserError


@pytest.fixture
def image(docker_image: str) -> str:
    """The test image (checked once per session, in conftest)."""
    return docker_image


def engine() -> Any:
    import docker

    return docker.from_env()


@pytest.fixture(autouse=True)
def remove_leftovers(tmp_path: Path) -> Iterator[None]:
    """A failed test leaves no container behind (the tests check there are none first)."""
    yield
    try:
        api = engine().api
    except Exception:
        return  # no engine (or no docker package): nothing was started
    for container in api.containers(all=True, filters={"label": ROOT_LABEL}):
        if container["Labels"][ROOT_LABEL].startswith(str(tmp_path)):
            api.remove_container(container["Id"], force=True)


def containers_of(root: Path) -> list[dict[str, Any]]:
    return engine().api.containers(all=True, filters={"label": f"{ROOT_LABEL}={root}"})


def engine_events(root: Path, event: str, since: float) -> Counter[str]:
    """How often each container of ``root`` had ``event`` (create, start, die) since then."""
    events = engine().api.events(
        since=since,
        until=time.time() + 0.1,
        filters={"type": "container", "event": event, "label": f"{ROOT_LABEL}={root}"},
        decode=True,
    )
    return Counter(e["Actor"]["Attributes"]["name"] for e in events)


def make_backend(tmp_path: Path, image: str, **options: Any) -> DockerBackend:
    config = DockerBackendConfig(
        root=str(tmp_path / "jobs"), image=image, poll_interval=0.1, **options
    )
    return DockerBackend(config, tmp_path)


def log_lines(backend: DockerBackend, handle: JobHandle) -> list[str]:
    return backend.read_logs(handle, 0, final=True).lines


# -- the backend's verbs -----------------------------------------------------------------------


def test_ended_containers_are_collected_removed_and_never_created_again(
    tmp_path: Path, image: str
) -> None:
    since = time.time()
    backend = make_backend(tmp_path, image)
    spec = JobSpec(name="logs", command="echo one; echo two >&2; sleep 1")
    handle = backend.submit(spec)
    status = job_end(backend, handle)
    assert status.state is JobState.SUCCEEDED and status.exit_code == 0
    assert status.ended_at is not None and status.started_at is not None
    assert 0.9 < status.ended_at - status.started_at < 30
    assert log_lines(backend, handle) == ["one", "two"]  # stderr too, in one log
    assert containers_of(backend.root) == []  # collected, then removed
    assert backend.submit(spec) == handle  # ended and removed: still never created again
    failing = backend.submit(JobSpec(name="fails", command="echo oops; exit 3"))
    status = job_end(backend, failing)
    assert (status.state, status.exit_code) == (JobState.FAILED, 3)
    assert status.reason == "command exited with code 3"
    assert backend.poll([failing])[failing.id] == status  # from the job's directory now
    assert engine_events(backend.root, "create", since) == {handle.id: 1, failing.id: 1}


def test_poll_is_one_engine_call_and_wait_wakes_when_a_container_ends(
    tmp_path: Path, image: str
) -> None:
    backend = make_backend(tmp_path, image)
    held = f"until [ -e {GO} ]; do sleep 0.02; done; echo done"  # each until its gate opens
    handles = [backend.submit(JobSpec(name=f"j{i}", command=held)) for i in range(3)]
    calls: Counter[str] = Counter()
    api = backend.client.api
    for method in ("containers", "inspect_container"):
        original = getattr(api, method)

        def counted(*args: Any, _original: Any = original, _name: str = method, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kw)

        setattr(api, method, counted)
    statuses = backend.poll(handles)
    assert calls == {"containers": 1}
    assert {s.state for s in statuses.values()} == {JobState.RUNNING}
    waiting = threading.Thread(target=backend.wait, args=(handles, 600))
    waiting.start()
    assert_stays(waiting.is_alive, 1.0, "wait, while no container ends")
    open_gate(backend, handles[0])
    waiting.join(timeout=120)  # far sooner than its 600 s: woken by the container's end
    assert not waiting.is_alive(), "wait did not wake when a container ended"
    assert backend.poll(handles)[handles[0].id].state is JobState.SUCCEEDED
    for handle in handles[1:]:
        open_gate(backend, handle)
        job_end(backend, handle)
    assert containers_of(backend.root) == []


GO = "/ml/output/model/go"  # a job's gate, in its container: the model channel, shared


def open_gate(backend: DockerBackend, handle: JobHandle) -> None:
    """Let a job held until ``GO`` exists end."""
    (backend.job_dir(handle.name) / GO.removeprefix("/")).touch()


def test_stop_is_docker_stop_with_the_grace_period(tmp_path: Path, image: str) -> None:
    backend = make_backend(tmp_path, image, stop_grace_period=1.0)
    stubborn = "trap '' TERM; echo ready; while true; do sleep 0.1; done"
    graceful = "trap 'echo got TERM; exit 0' TERM; echo ready; while true; do sleep 0.1; done"
    handles = [
        backend.submit(JobSpec(name="stubborn", command=stubborn)),
        backend.submit(JobSpec(name="graceful", command=graceful)),
    ]
    for handle in handles:
        wait_until(lambda h=handle: "ready" in log_lines(backend, h), 60, f"{handle.name} ready")
    started = time.monotonic()
    for handle in handles:
        backend.stop(handle)
    statuses = [job_end(backend, handle, timeout=30) for handle in handles]
    assert [s.state for s in statuses] == [JobState.STOPPED, JobState.STOPPED]
    assert time.monotonic() - started < 10
    assert log_lines(backend, handles[1])[-1] == "got TERM"
    assert containers_of(backend.root) == []


def test_memory_limit_kill_is_reported_as_out_of_memory(tmp_path: Path, image: str) -> None:
    backend = make_backend(tmp_path, image, memory="64m")
    hog = "echo allocating; python -c 'data = b\"x\" * (512 << 20); print(len(data))'"
    handle = backend.submit(JobSpec(name="hog", command=hog, instance_type="ecs.c6.large"))
    status = job_end(backend, handle)
    assert status.state is JobState.FAILED and status.exit_code == 137
    assert status.reason == (
        "killed: out of memory (limit 64 MiB, instance type ecs.c6.large, backend.memory=64m)"
    )
    lines = log_lines(backend, handle)
    assert lines[0] == "allocating" and str(512 << 20) not in lines


def test_instance_type_limits_labels_and_kept_containers(
    tmp_path: Path, image: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make_backend(tmp_path, image, keep_containers=True)
    labels = {"paiexp-study": "s", "paiexp-trial": "3"}
    specs = [
        JobSpec(name="c6", command="nproc", instance_type="ecs.c6.large", labels=labels),
        JobSpec(name="g6", command="true", instance_type="ecs.g6.xlarge"),
    ]
    with caplog.at_level(logging.WARNING):
        for spec in specs:
            backend.validate(spec)
    assert "ecs.g6.xlarge asks for 4 CPUs" in caplog.text
    handles = [backend.submit(spec) for spec in specs]
    for handle in handles:
        assert job_end(backend, handle).state is JobState.SUCCEEDED
    api = engine().api
    c6, g6 = (api.inspect_container(handle.id) for handle in handles)  # kept
    assert c6["HostConfig"]["NanoCpus"] == 2 * 10**9
    assert c6["HostConfig"]["Memory"] == c6["HostConfig"]["MemorySwap"] == 4 << 30
    assert g6["HostConfig"]["NanoCpus"] == engine().info()["NCPU"] * 10**9  # capped
    assert g6["HostConfig"]["Memory"] == 16 << 30
    assert c6["Config"]["Labels"] == {
        **labels,
        JOB_LABEL: "c6",
        ROOT_LABEL: str(backend.root),
    }
    assert c6["HostConfig"]["Init"] is True and c6["Config"]["WorkingDir"] == "/ml/usercode"
    environment = dict(item.split("=", 1) for item in c6["Config"]["Env"])
    assert environment["OMP_NUM_THREADS"] == "2"
    assert backend.poll(handles)[handles[0].id].state is JobState.SUCCEEDED  # kept, collected
    for handle in handles:
        api.remove_container(handle.id, force=True)


def test_requirements_are_installed_before_the_command_offline(tmp_path: Path, image: str) -> None:
    source = tmp_path / "code"
    source.mkdir()
    (source / "requirements.txt").write_text("pandas>=1.5\n# a comment\nnumpy\n")
    offline = make_backend(tmp_path, image, network="none")
    always = DockerBackend(
        DockerBackendConfig(
            root=str(tmp_path / "always"),
            image=image,
            network="none",
            install_requirements="always",
        ),
        tmp_path,
    )
    code = str(source)
    met = offline.submit(JobSpec(name="met", command="echo ran", source_dir=code))
    unmet = offline.submit(
        JobSpec(
            name="unmet",
            command="echo ran",
            requirements=("paiexp-no-such-package==0.0.1",),
            environments={"PIP_NO_INDEX": "1"},
        )
    )
    forced = always.submit(JobSpec(name="forced", command="echo ran", source_dir=code))
    assert job_end(offline, met).state is JobState.SUCCEEDED
    assert log_lines(offline, met) == [
        "[paiexp] requirements already satisfied: pandas>=1.5, numpy",
        "ran",
    ]
    status = job_end(offline, unmet)
    assert status.state is JobState.FAILED
    assert status.reason == "installing the job's requirements failed (see log)"
    assert "ran" not in log_lines(offline, unmet)
    assert job_end(always, forced).state is JobState.SUCCEEDED  # pip, with no network
    lines = log_lines(always, forced)
    assert lines[0] == "[paiexp] installing requirements: -r requirements.txt"
    assert any(line.startswith("Requirement already satisfied: pandas") for line in lines)
    assert lines[-1] == "ran"


# -- through the command line ------------------------------------------------------------------


def test_probe_sees_the_pai_contract_in_a_container(project: Path, image: str) -> None:
    write_probe_project(project)
    result = run_paiexp(project, "job=probe", "backend=docker", f"backend.image={image}", "-q")
    assert result.returncode == 0, result.stderr
    root = project / ".paiexp" / "docker"
    (job_dir,) = (path for path in root.iterdir() if not path.name.startswith("."))
    seen_file = job_dir / "ml" / "output" / "model" / "seen.json"
    assert_contract_seen(json.loads(seen_file.read_text()), PurePosixPath("/ml"))
    assert seen_file.stat().st_uid == os.getuid()
    assert containers_of(root) == []


def test_xgb_sweep_in_containers(tmp_path: Path, image: str) -> None:
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, tmp_path / name)
    result = run_paiexp(
        tmp_path, "+sweep=xgb", "backend=docker", f"backend.image={image}", "sweep.n_trials=4"
    )
    assert result.returncode == 0, result.stderr
    study = load_study(tmp_path, "xgb")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    parents, children = sweep_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 4
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["job.backend"] == "docker"
        model_dir = Path(child.data.tags["paiexp.model_uri"].removeprefix("file://"))
        assert model_dir.parent.parent.parent.parent == tmp_path / ".paiexp" / "docker"
        assert json.loads((model_dir / "model.json").read_text())["learner"]
        log = (model_dir.parents[2] / "paiexp" / "job.log").read_text()
        assert log.startswith("[paiexp] requirements already satisfied: pandas>=1.5, numpy\n")
    assert containers_of(tmp_path / ".paiexp" / "docker") == []


def test_oss_inputs_are_downloaded_once_and_mounted(tmp_path: Path, image: str) -> None:
    from emulator import Emulator

    for name in ("conf", "examples"):
        shutil.copytree(REPO / name, tmp_path / name)
    data = REPO / "examples" / "xgb" / "data"
    with Emulator(tmp_path / "cloud") as cloud:
        for split in ("train", "test"):
            cloud.store.put(cloud.bucket, f"data/{split}.csv", (data / f"{split}.csv").read_bytes())
        env = clean_env(
            ALIBABA_CLOUD_ACCESS_KEY_ID=cloud.credentials.access_key_id,
            ALIBABA_CLOUD_ACCESS_KEY_SECRET=cloud.credentials.access_key_secret,
            XDG_CACHE_HOME=str(tmp_path / "cache"),
        )
        args = [
            "backend=docker",
            f"backend.image={image}",
            f"backend.oss.endpoint={cloud.oss_endpoint}",
            f"job.inputs.train=oss://{cloud.bucket}/data/train.csv",
            f"job.inputs.test=oss://{cloud.bucket}/data/",  # a prefix: a directory
            "job.hyperparameters.n_estimators=10",
            "-q",
        ]
        for _ in range(2):
            result = run_paiexp(tmp_path, *args, env=env)
            assert result.returncode == 0, result.stderr
        gets = [r for r in cloud.log.records("oss", "GetObject")]
        assert sorted(r.path for r in gets) == [  # the second run downloaded nothing
            f"/{cloud.bucket}/data/test.csv",
            f"/{cloud.bucket}/data/train.csv",
        ]
        missing = run_paiexp(
            tmp_path, *args, f"+job.inputs.extra=oss://{cloud.bucket}/nothing/here", env=env
        )
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"paiexp: error: job.inputs.extra: no object or prefix oss://{cloud.bucket}/nothing/here "
        "on OSS"
    )
    runs = all_runs(tmp_path)
    assert len(runs) == 2 and all(r.data.metrics["test-auc"] > 0.9 for r in runs)


class ChannelGates(Gates):
    """Gates in each job's own checkpoints channel (a container sees no directory of the
    test's): ``/ml/output/checkpoints`` in its container, under ``JOB/ml/output`` in ``jobs``."""

    def env(self) -> dict[str, str]:
        return {"GATES": "/ml/output/checkpoints"}

    def held(self) -> list[Path]:
        return [
            path
            for path in self.directory.glob("*/ml/output/checkpoints/*.held")
            if not path.with_suffix(".open").exists()
        ]

    def opened(self) -> list[Path]:
        return [
            p.with_suffix(".held") for p in self.directory.glob("*/ml/output/checkpoints/*.open")
        ]


def test_sigkilled_launcher_reattaches_to_running_containers(tmp_path: Path, image: str) -> None:
    jobs = tmp_path / ".paiexp" / "docker"
    gates = ChannelGates(jobs)  # each job's container runs until the test opens its gate
    root = synthetic_project(
        tmp_path,
        {"params": {"x": "interval(-1, 1)"}, "n_trials": 6, "parallelism": 2},
        {"environments": gates.env()},
    )
    command = [sys.executable, "-m", "paiexp", "+sweep=syn", "backend=docker"]
    command.append(f"backend.image={image}")
    since = time.time()
    reattached: set[str] = set()
    held: list[Path] = []
    for _ in range(2):
        launcher = subprocess.Popen(
            command,
            cwd=root,
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        gates.open(held[:1])  # a slot frees: the relaunch starts a container of its own
        before, held = held, gates.wait_held(2)
        assert set(held) - set(before), "no new container held"
        # kill it while the containers it started (or adopted) run, held
        assert launcher.poll() is None
        containers = {c["Labels"][JOB_LABEL]: c for c in containers_of(jobs)}
        names = {path.parents[3].name for path in held}  # JOB/ml/output/checkpoints/ID.held
        assert {containers[n]["State"] for n in names} == {"running"}
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert sorted(gates.held()) == sorted(held)  # none let end: they run past the kill
        reattached |= {containers[n]["Names"][0].lstrip("/") for n in names}
    with gates.all_open():
        final = run_paiexp(root, "+sweep=syn", "backend=docker", f"backend.image={image}")
    assert final.returncode == 0, final.stderr
    assert "re-attaching to job" in final.stderr

    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    created = engine_events(jobs, "create", since)
    assert sorted(created.values()) == [1] * 6  # six containers, none created twice
    assert engine_events(jobs, "start", since) == created
    backend = DockerBackend(DockerBackendConfig(), root)
    names = {t.user_attrs["paiexp:job_name"] for t in study.trials}
    assert {backend.container_name(name) for name in names} == set(created)
    assert reattached <= set(created)
    parents, children = sweep_runs(root)
    assert len(children) == 6 and {c.info.status for c in children} == {"FINISHED"}
    assert parents[0].info.status == "FINISHED"
    assert containers_of(jobs) == []


# -- bad input: one line, exit code 2, nothing started -----------------------------------------


@pytest.mark.slow
def test_config_mistakes_are_reported_without_importing_docker(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(project))  # no Alibaba Cloud CLI profile either
    calls = [
        (["backend=docker", "backend.install_requirements=sometimes"], 2),
        (["backend=docker", "job.instance_type=ecs.nope.large"], 2),
        (["backend=docker", "backend.memory=lots"], 2),
        (["backend=docker", "backend.cpus=0"], 2),
        (["backend=docker", "+job.inputs.extra=oss://bucket/data.csv"], 2),
        (["backend=docker", "--cfg", "job"], 0),
    ]
    result = run_without_heavy_imports(project, calls)
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("paiexp: error: ")]
    assert len(errors) == 5, result.stderr
    assert "backend.install_requirements: invalid value 'sometimes'" in errors[0]
    assert "job.instance_type: unknown instance type 'ecs.nope.large'" in errors[1]
    assert "ecs.c6.large" in errors[1] and "backend.cpus and backend.memory" in errors[1]
    assert errors[2].endswith("invalid value 'lots'; expected a size like 512m, 4g or 16GiB")
    assert "backend.cpus" in errors[3]
    assert errors[4].startswith("paiexp: error: no Alibaba Cloud credentials: set ")
    assert_nothing_started(project)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("paiexp: error:")]
    return line


def test_missing_image_and_engine_are_clear_errors(project: Path, image: str) -> None:
    missing = one_line_error(
        run_paiexp(project, "backend=docker", "backend.image=paiexp-test/no-such-image:0")
    )
    assert "backend.image: image 'paiexp-test/no-such-image:0'" in missing
    assert "tests/images/build.sh" in missing
    no_image = one_line_error(run_paiexp(project, "backend=docker"))
    assert "job.image: backend=docker needs an image" in no_image
    engine_gone = one_line_error(
        run_paiexp(
            project,
            "backend=docker",
            f"backend.image={image}",
            env=clean_env(DOCKER_HOST=f"unix://{project}/no-engine.sock"),
        )
    )
    assert f"DOCKER_HOST=unix://{project}/no-engine.sock" in engine_gone
    if "nvidia" not in engine().info().get("Runtimes", {}):
        no_gpu = one_line_error(
            run_paiexp(
                project,
                "backend=docker",
                f"backend.image={image}",
                "job.instance_type=ecs.gn6i-c4g1.xlarge",
            )
        )
        assert "backend.gpus: instance type ecs.gn6i-c4g1.xlarge asks for 1 GPU(s)" in no_gpu
        assert "backend.gpus=0" in no_gpu
    assert_nothing_started(project)


def test_missing_docker_package_is_a_clear_error(project: Path) -> None:
    blocker = project / "blocker" / "docker"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('docker is not installed')\n")
    env = clean_env(PYTHONPATH=str(project / "blocker"))
    line = one_line_error(run_paiexp(project, "backend=docker", "job.image=x", env=env))
    assert line == (
        "paiexp: error: backend=docker needs the docker package: pip install 'paiexp[docker]'"
    )
    assert_nothing_started(project)


def test_unknown_instance_type_with_explicit_limits_runs(tmp_path: Path, image: str) -> None:
    backend = make_backend(tmp_path, image, cpus=1.0, memory="256m")
    spec = JobSpec(name="custom", command="true", instance_type="ecs.custom.tiny")
    backend.validate(spec)
    assert job_end(backend, backend.submit(spec)).state is JobState.SUCCEEDED
    with pytest.raises(UserError, match=r"job\.instance_type: unknown instance type"):
        make_backend(tmp_path, image, cpus=1.0).validate(spec)
