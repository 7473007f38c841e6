"""The Backend protocol's contract: the same scenarios on every backend.

Each backend is one entry of ``PLATFORMS``: a function that builds a :class:`Platform`, the
backend under test plus the few things a scenario cannot learn through the protocol itself
(what a job needs to run there, where the files behind an output URI are, what a bad spec
looks like there, how its platform fails). Adding a backend is adding one entry.

The PAI backend runs against the session's emulator (``pai_cloud``), so job names are unique
per test; docker needs the engine and the test image and fails (never skips) without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from conftest import assert_stays, wait_until

from paiexp.backends import Backend, JobHandle, JobState, JobStatus
from paiexp.config.spec import JobSpec
from paiexp.errors import UserError
from paiexp.util.jsonfiles import read_json

# A command that leaves "ready" in its log, then runs until stopped.
RUNS_UNTIL_STOPPED = "echo ready; sleep 60"


@dataclass
class Platform:
    """A backend under test and what the scenarios need to know about its platform."""

    name: str
    backend: Backend
    # Another backend object on the same platform and root: a second (or restarted) launcher.
    again: Callable[[], Backend]
    # Bytes of the file at a URI that ``outputs()`` handed out (file://, oss://, ...).
    read: Callable[[str], bytes]
    # An output destination this backend writes to, for a channel ``name`` of this test.
    destination: Callable[[str], str]
    # A backend object whose platform fails every request, while the context lasts.
    failing: Callable[[], contextlib.AbstractContextManager[Backend]]
    # Specs ``validate`` must reject here: id -> (JobSpec fields, regex of the message).
    bad_specs: dict[str, tuple[dict[str, Any], str]]
    # The reason of a job that ran past ``max_run_time`` matches this.
    timeout_reason: str
    # What every spec needs here (image, instance type).
    spec_defaults: dict[str, Any] = field(default_factory=dict)
    # How many jobs the platform itself created under a name (None: no such count).
    created: Callable[[str], int] | None = None
    # Status requests the platform has served so far (None: not observable).
    status_calls: Callable[[], int] | None = None
    # The spec fields that run a command here (None: the command itself).
    command_fields: Callable[[str], dict[str, Any]] | None = None
    submitted: list[JobHandle] = field(default_factory=list)

    def spec(self, short: str, command: str, **fields: Any) -> JobSpec:
        """A job named uniquely (the PAI emulator is shared by the session)."""
        name = f"{short}-{uuid.uuid4().hex[:8]}"
        run = self.command_fields(command) if self.command_fields else {"command": command}
        return JobSpec(name=name, **{**self.spec_defaults, **run, **fields})

    def submit(self, spec: JobSpec) -> JobHandle:
        self.backend.validate(spec)
        handle = self.backend.submit(spec)
        self.submitted.append(handle)
        return handle

    def finish(self, handle: JobHandle, timeout: float = 60) -> JobStatus:
        """Poll (and wait) until the job has ended; its final status."""

        def ended() -> JobStatus | None:
            status = self.backend.poll([handle])[handle.id]
            if status.state.terminal:
                return status
            self.backend.wait([handle], 0.2)
            return None

        return wait_until(ended, timeout, f"{self.name} job {handle.name} to end", interval=0)

    def log(self, handle: JobHandle) -> list[str]:
        return self.backend.read_logs(handle, 0, final=True).lines


def file_uri_path(uri: str) -> Path:
    parsed = urlparse(uri)
    assert parsed.scheme == "file", uri
    return Path(unquote(parsed.path))


def as_uri(location: str) -> str:
    """A destination as ``outputs()`` spells it: local paths as file:// URIs."""
    return location if "://" in location else Path(location).as_uri()


def child(uri: str, name: str) -> str:
    return f"{uri.rstrip('/')}/{name}"


# -- the platforms -----------------------------------------------------------------------------


def local_platform(
    request: pytest.FixtureRequest, tmp_path: Path, *, warm: bool = False
) -> Platform:
    from paiexp.backends.local import LocalBackend
    from paiexp.config.schema import LocalBackendConfig

    config = LocalBackendConfig(root=str(tmp_path / "jobs"), poll_interval=0.1)
    config.stop_grace_period = 2.0

    def backend() -> LocalBackend:
        made = LocalBackend(config, tmp_path)
        if warm:
            made.set_concurrency(2)  # a sweep's: Python jobs forked from a warm interpreter
        return made

    @contextlib.contextmanager
    def failing() -> Iterator[Backend]:
        # The local platform is this machine's file system: a root that can no longer be a
        # directory (a file got in its way once the backend was made; permissions would not
        # stop root, and a root that cannot be made is refused as the backend is made).
        blocker = tmp_path / "not-a-directory"
        broken = LocalBackend(dataclasses.replace(config, root=str(blocker / "jobs")), tmp_path)
        blocker.write_text("")
        yield broken

    return Platform(
        name="local-warm" if warm else "local",
        backend=backend(),
        again=backend,
        read=lambda uri: file_uri_path(uri).read_bytes(),
        destination=lambda name: str(tmp_path / "destinations" / name),
        failing=failing,
        bad_specs={
            "oss-output": ({"outputs": {"model": "oss://bucket/models/"}}, r"job\.outputs\.model"),
            "oss-input": ({"inputs": {"train": "oss://bucket/a.csv"}}, r"job\.inputs\.train"),
        },
        timeout_reason=r"^exceeded max_run_time of 1 s$",
        command_fields=warm_command(tmp_path) if warm else None,
    )


def local_warm_platform(request: pytest.FixtureRequest, tmp_path: Path) -> Platform:
    """backend=local as a sweep runs it: each scenario's command run by a Python script that
    the sweep's warm interpreter forks."""
    return local_platform(request, tmp_path, warm=True)


def warm_command(tmp_path: Path) -> Callable[[str], dict[str, Any]]:
    code = tmp_path / "warm-code"
    code.mkdir()
    (code / "run.py").write_text(
        "import os, sys\n"
        "sys.exit(os.waitstatus_to_exitcode(os.system(os.environ['CONTRACT_COMMAND'])))\n"
    )
    return lambda command: {
        "command": "python run.py",
        "source_dir": str(code),
        "environments": {"CONTRACT_COMMAND": command},
    }


def docker_platform(request: pytest.FixtureRequest, tmp_path: Path) -> Platform:
    from paiexp.backends.docker import ROOT_LABEL, DockerBackend
    from paiexp.config.schema import DockerBackendConfig

    image = request.getfixturevalue("docker_image")
    monkeypatch = request.getfixturevalue("monkeypatch")
    since = time.time()
    # No backend.image: the image comes from the spec, so a spec without one is a bad spec.
    config = DockerBackendConfig(
        root=str(tmp_path / "jobs"), poll_interval=0.1, stop_grace_period=2.0
    )
    backend = DockerBackend(config, tmp_path)

    def created(name: str) -> int:
        events = backend.client.api.events(
            since=since,
            until=time.time() + 0.1,
            filters={
                "type": "container",
                "event": "create",
                "label": f"{ROOT_LABEL}={backend.root}",
            },
            decode=True,
        )
        names = Counter(e["Actor"]["Attributes"]["name"] for e in events)
        return names[backend.container_name(name)]

    @contextlib.contextmanager
    def failing() -> Iterator[Backend]:
        with monkeypatch.context() as patch:  # an engine that does not answer
            patch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
            yield DockerBackend(config, tmp_path)

    def remove_containers() -> None:
        api = backend.client.api
        for container in api.containers(
            all=True, filters={"label": f"{ROOT_LABEL}={backend.root}"}
        ):
            api.remove_container(container["Id"], force=True)

    request.addfinalizer(remove_containers)
    return Platform(
        name="docker",
        backend=backend,
        again=lambda: DockerBackend(config, tmp_path),
        read=lambda uri: file_uri_path(uri).read_bytes(),
        destination=lambda name: str(tmp_path / "destinations" / name),
        failing=failing,
        bad_specs={
            "oss-output": ({"outputs": {"model": "oss://bucket/models/"}}, r"job\.outputs\.model"),
            "no-image": ({"image": None}, r"job\.image: backend=docker needs an image"),
        },
        timeout_reason=r"^exceeded max_run_time of 1 s$",
        spec_defaults={"image": image},
        created=created,
    )


def pai_platform(request: pytest.FixtureRequest, tmp_path: Path) -> Platform:
    from emulator.common import FaultPlan
    from emulator.store import split_uri

    from paiexp.backends.pai import PaiBackend
    from paiexp.config.schema import PaiBackendConfig, PaiOssConfig, PaiRetryConfig

    cloud = request.getfixturevalue("pai_cloud")
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", cloud.credentials.access_key_id)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", cloud.credentials.access_key_secret)
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = PaiBackendConfig(
        workspace_id=cloud.workspace_id,
        endpoint=cloud.pai_endpoint,
        protocol="http",
        oss=PaiOssConfig(bucket=cloud.bucket, endpoint=cloud.oss_endpoint),
        retry=PaiRetryConfig(attempts=3, base_delay=0.02, max_delay=0.1),
        poll_interval=0.1,
        log_interval=0.1,
        request_timeout=10,
    )

    def read(uri: str) -> bytes:
        data = cloud.store.get(*split_uri(uri))
        assert data is not None, f"no object at {uri}"
        return bytes(data)

    def created(name: str) -> int:
        return sum(job["TrainingJobName"] == name for job in cloud.jobs())

    def status_calls() -> int:
        return sum(
            len(cloud.log.records("pai", action))
            for action in ("ListTrainingJobs", "GetTrainingJob")
        )

    @contextlib.contextmanager
    def failing() -> Iterator[Backend]:
        faults = cloud.faults
        cloud.faults = FaultPlan(rate=1.0)
        try:
            yield PaiBackend(config, tmp_path)
        finally:
            cloud.faults = faults

    return Platform(
        name="pai",
        backend=PaiBackend(config, tmp_path),
        again=lambda: PaiBackend(config, tmp_path),
        read=read,
        destination=lambda name: (
            f"oss://{cloud.bucket}/destinations/{uuid.uuid4().hex[:8]}/{name}/"
        ),
        failing=failing,
        bad_specs={
            "no-image": ({"image": None}, r"job\.image: backend=pai needs a training image"),
            "no-instance-type": ({"instance_type": None}, r"job\.instance_type"),
            "local-output": (
                {"outputs": {"model": str(tmp_path / "model")}},
                r"job\.outputs\.model: backend=pai writes outputs to OSS",
            ),
        },
        timeout_reason=r"^PAI Failed \(JobTimeout: .*MaxRunningTimeInSeconds=1\b",
        spec_defaults={"image": cloud.default_image, "instance_type": "ecs.c6.large"},
        created=created,
        status_calls=status_calls,
    )


def openpai_platform(request: pytest.FixtureRequest, tmp_path: Path) -> Platform:
    from emulator.common import FaultPlan
    from openpai_server import OpenPaiServer

    from paiexp.backends.openpai import OpenPaiBackend

    image = request.getfixturevalue("docker_image")
    monkeypatch = request.getfixturevalue("monkeypatch")
    server = OpenPaiServer(tmp_path / "openpai").start()  # its own cluster: exact counts
    request.addfinalizer(server.stop)
    monkeypatch.setenv("OPENPAI_TOKEN", server.token)
    storage = server.storage_dir("confignfs")
    config = openpai_config(server, poll_interval=0.1, log_interval=0.1, cpus=1)

    @contextlib.contextmanager
    def failing() -> Iterator[Backend]:
        faults = server.faults
        server.faults = FaultPlan(rate=1.0, kinds=("error", "drop"))
        try:
            yield OpenPaiBackend(config, tmp_path)
        finally:
            server.faults = faults

    return Platform(
        name="openpai",
        backend=OpenPaiBackend(config, tmp_path),
        again=lambda: OpenPaiBackend(config, tmp_path),
        read=lambda uri: file_uri_path(uri).read_bytes(),
        destination=lambda name: str(storage / "destinations" / uuid.uuid4().hex[:8] / name),
        failing=failing,
        bad_specs={
            "no-image": ({"image": None}, r"job\.image: backend=openpai needs the docker image"),
            "unknown-instance-type": (
                {"instance_type": "ecs.nope.large"},
                r"job\.instance_type: unknown instance type 'ecs\.nope\.large' for backend=openpai",
            ),
            "oss-input": ({"inputs": {"train": "oss://bucket/a.csv"}}, r"job\.inputs\.train"),
            "output-off-storage": (
                {"outputs": {"model": str(tmp_path / "model")}},
                r"job\.outputs\.model: backend=openpai writes outputs to its storage",
            ),
        },
        timeout_reason=r"^exceeded max_run_time of 1 s$",
        spec_defaults={"image": image, "instance_type": "ecs.c6.large"},
        created=lambda name: server.submissions[name],
        status_calls=lambda: len(server.records("ListJobs")) + len(server.records("GetJob")),
    )


def openpai_config(server: Any, **settings: Any) -> Any:
    """A backend=openpai config for a fake cluster (its token: OPENPAI_TOKEN)."""
    from paiexp.config.schema import OpenPaiBackendConfig, OpenPaiStorageConfig, PaiRetryConfig

    storage = OpenPaiStorageConfig(
        name="confignfs", local_path=str(server.storage_dir("confignfs"))
    )
    return OpenPaiBackendConfig(
        rest_server_uri=server.rest_server_uri,
        user=server.user,
        storage=storage,
        retry=PaiRetryConfig(attempts=3, base_delay=0.02, max_delay=0.1),
        request_timeout=10,
        **settings,
    )


PLATFORMS: dict[str, Callable[[pytest.FixtureRequest, Path], Platform]] = {
    "local": local_platform,
    "local-warm": local_warm_platform,
    "docker": docker_platform,
    "pai": pai_platform,
    "openpai": openpai_platform,
}
MARKS = {"docker": [pytest.mark.docker], "pai": [pytest.mark.slow], "openpai": [pytest.mark.docker]}


@pytest.fixture(params=[pytest.param(name, marks=MARKS.get(name, [])) for name in PLATFORMS])
def platform(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Platform]:
    made = PLATFORMS[request.param](request, tmp_path)
    yield made
    if made.name == "local-warm":  # every job that ran was forked warm
        for handle in made.submitted:
            state = read_json(Path(made.backend.job_dir(handle.id)) / "state.json") or {}
            assert "pid" not in state or state.get("warm"), handle.name
    for handle in made.submitted:  # nothing a failed test started keeps running
        with contextlib.suppress(Exception):
            if not made.backend.poll([handle])[handle.id].state.terminal:
                made.backend.stop(handle)
                made.finish(handle, timeout=30)


# -- the scenarios -----------------------------------------------------------------------------


def test_submit_is_idempotent_by_name(platform: Platform) -> None:
    backend = platform.backend
    spec = platform.spec("once", 'echo ran >> "$PAI_OUTPUT_MODEL/ledger"')
    assert backend.find(spec.name) is None
    handle = platform.submit(spec)
    assert backend.submit(spec) == handle  # the same launcher again...
    assert platform.again().submit(spec) == handle  # ...or another one
    assert backend.find(spec.name) == handle
    assert platform.again().find(spec.name) == handle
    assert platform.finish(handle).state is JobState.SUCCEEDED
    assert backend.submit(spec) == handle  # ended: returned, never run again
    assert platform.again().submit(spec) == handle
    assert_stays(
        lambda: backend.poll([handle])[handle.id].state is JobState.SUCCEEDED,
        0.5,
        "the ended job's state after submitting it again",
    )
    ledger = child(backend.outputs(handle)["model"], "ledger")
    assert platform.read(ledger) == b"ran\n"  # the command ran once
    if platform.created is not None:
        assert platform.created(spec.name) == 1


def test_a_name_never_submitted_is_not_found(platform: Platform) -> None:
    assert platform.backend.find(f"never-{uuid.uuid4().hex[:8]}") is None


def test_poll_answers_for_many_jobs_in_one_call(platform: Platform) -> None:
    labels = {"paiexp-study": f"contract-{uuid.uuid4().hex[:8]}"}  # as a sweep's jobs share
    handles = [
        platform.submit(platform.spec(f"many{i}", f"echo {i}", labels=labels)) for i in range(3)
    ]
    assert len({h.id for h in handles}) == 3
    before = platform.status_calls() if platform.status_calls else 0
    statuses = platform.backend.poll(handles)
    if platform.status_calls is not None:
        assert platform.status_calls() - before == 1  # one platform request for all three
    assert set(statuses) == {h.id for h in handles}
    assert all(isinstance(s.state, JobState) for s in statuses.values())

    def all_ended() -> dict[str, JobStatus] | None:
        statuses = platform.backend.poll(handles)
        if all(s.state.terminal for s in statuses.values()):
            return statuses
        platform.backend.wait(handles, 0.2)
        return None

    ended = wait_until(all_ended, 60, "all three jobs to end", interval=0)
    assert set(ended) == {h.id for h in handles}
    assert {s.state for s in ended.values()} == {JobState.SUCCEEDED}
    assert [platform.log(h) for h in handles] == [["0"], ["1"], ["2"]]


def test_logs_are_read_from_an_opaque_cursor(platform: Platform) -> None:
    backend = platform.backend
    handle = platform.submit(platform.spec("logs", "echo one; echo two; printf three; sleep 2"))
    seen: list[str] = []
    cursor = 0

    def two_lines() -> bool:
        nonlocal cursor
        chunk = backend.read_logs(handle, cursor)
        seen.extend(chunk.lines)
        cursor = chunk.cursor  # only ever passed back
        return "two" in seen

    wait_until(two_lines, 60, "the first two log lines")
    assert seen == ["one", "two"]  # "three" has no newline yet: not a complete line
    assert platform.finish(handle).state is JobState.SUCCEEDED
    rest = backend.read_logs(handle, cursor, final=True)
    assert rest.lines == ["three"]  # the unterminated tail, once final
    assert backend.read_logs(handle, rest.cursor, final=True).lines == []
    assert backend.read_logs(handle, rest.cursor).lines == []
    assert platform.log(handle) == ["one", "two", "three"]


def test_stop_ends_the_job_stopped(platform: Platform) -> None:
    handle = platform.submit(platform.spec("stop", RUNS_UNTIL_STOPPED))
    wait_until(lambda: "ready" in platform.log(handle), 60, "the job to start")
    started = time.monotonic()
    platform.backend.stop(handle)
    status = platform.finish(handle, timeout=30)
    assert status.state is JobState.STOPPED
    assert time.monotonic() - started < 20


def test_max_run_time_fails_the_job_with_its_reason(platform: Platform) -> None:
    started = time.monotonic()
    handle = platform.submit(platform.spec("slow", "sleep 60", max_run_time=1))
    status = platform.finish(handle, timeout=30)
    assert status.state is JobState.FAILED
    assert status.reason is not None
    assert re.search(platform.timeout_reason, status.reason), status.reason
    assert time.monotonic() - started < 20


def test_outputs_point_where_the_files_are(platform: Platform) -> None:
    destination = platform.destination("model")
    command = (
        'echo weights > "$PAI_OUTPUT_MODEL/model.txt"; echo hello > "$PAI_OUTPUT_EXTRA/x.txt";'
        ' mkdir "$PAI_OUTPUT_CHECKPOINTS/no-files-in-here"'
    )
    spec = platform.spec("outs", command, outputs={"model": destination, "extra": None})
    handle = platform.submit(spec)
    assert platform.finish(handle).state is JobState.SUCCEEDED
    outputs = platform.backend.outputs(handle)
    assert set(outputs) == {"model", "checkpoints", "tensorboard", "extra"}
    assert outputs["model"].startswith(as_uri(destination).rstrip("/"))
    assert platform.read(child(outputs["model"], "model.txt")) == b"weights\n"
    assert platform.read(child(outputs["extra"], "x.txt")) == b"hello\n"
    assert not platform.backend.output_is_empty(handle, "model")
    assert not platform.backend.output_is_empty(handle, "extra")
    assert platform.backend.output_is_empty(handle, "checkpoints")  # a directory, no file
    assert platform.backend.output_is_empty(handle, "tensorboard")
    assert platform.backend.output_is_empty(handle, "no-such-channel")


def test_output_parameters_are_read_back(platform: Platform) -> None:
    handle = platform.submit(
        platform.spec("params", 'echo 0.75 > "${PAI_OUTPUT_OUTPUT_PARAMETERS:?is not set}/acc"')
    )
    status = platform.finish(handle)
    assert status.state is JobState.SUCCEEDED, (status, platform.log(handle))
    assert platform.backend.output_parameters(handle) == {"acc": 0.75}


def test_label_never_raises(platform: Platform) -> None:
    ghost = JobHandle(f"ghost-{uuid.uuid4().hex[:8]}", f"no-such-job-{uuid.uuid4().hex[:8]}")
    platform.backend.label(ghost, {"paiexp-run": "r0"})
    handle = platform.submit(platform.spec("labelled", "true", labels={"paiexp-trial": "0"}))
    platform.backend.label(handle, {"paiexp-run": "r1"})
    platform.finish(handle)
    platform.backend.label(handle, {"paiexp-run": "r2"})  # ended
    with platform.failing() as broken:
        broken.label(handle, {"paiexp-run": "r3"})
        broken.label(ghost, {"paiexp-run": "r3"})


@pytest.mark.parametrize("job_type", ["PyTorchJob", "TFJob"])
def test_every_instance_gets_the_distributed_contract(platform: Platform, job_type: str) -> None:
    show = 'echo "dist $RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $NPROC_PER_NODE ${TF_CONFIG:-}"'
    spec = platform.spec("dist", show, instance_count=2, job_type=job_type)
    handle = platform.submit(spec)
    assert platform.finish(handle).state is JobState.SUCCEEDED
    logs = platform.backend.instance_logs(handle)
    names = ["worker-0", "worker-1"] if job_type == "TFJob" else ["master-0", "worker-0"]
    assert sorted(logs) == names
    seen = {}
    for rank, name in enumerate(names):
        (line,) = [x for x in logs[name].read_text().splitlines() if x.startswith("dist ")]
        _, got_rank, world, host, port, nproc, *tf_config = line.split(" ", 6)
        assert (got_rank, world, nproc) == (str(rank), "2", "1"), name
        seen[name] = (host, int(port))
        if job_type == "TFJob":
            config = json.loads(tf_config[0])
            assert config["task"] == {"type": "worker", "index": rank}
            assert config["environment"] == "cloud"
            assert len(config["cluster"]["worker"]) == 2
            assert config["cluster"]["worker"][0] == f"{host}:{port}"  # the master's
        else:
            assert tf_config == [""]
    assert len(set(seen.values())) == 1, seen  # every instance is told the same master
    assert platform.log(handle) == logs[names[0]].read_text().splitlines()  # the master's


def test_validate_rejects_a_bad_spec_before_anything_is_submitted(platform: Platform) -> None:
    for case, (fields, message) in platform.bad_specs.items():
        spec = platform.spec(f"bad-{case}", "echo never", **fields)
        with pytest.raises(UserError, match=message):
            platform.backend.validate(spec)
        assert platform.backend.find(spec.name) is None, case
        if platform.created is not None:
            assert platform.created(spec.name) == 0, case


def test_validate_rejects_an_input_path_that_does_not_exist(
    platform: Platform, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-data" / "train.csv"
    spec = platform.spec("bad-input", "echo never", inputs={"train": str(missing)})
    with pytest.raises(UserError, match=r"job\.inputs\.train"):
        platform.backend.validate(spec)
    assert platform.backend.find(spec.name) is None
