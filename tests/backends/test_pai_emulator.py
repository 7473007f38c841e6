"""The PAI control-plane emulator, driven by the official generated clients over real HTTP.

Its jobs run in containers of the test image, as PAI runs them in the job's image.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import pytest
from alibabacloud_aiworkspace20210204 import models as ws_models
from alibabacloud_aiworkspace20210204.client import Client as WorkspaceClient
from alibabacloud_paistudio20220112 import models as pai
from alibabacloud_paistudio20220112.client import Client as PaiClient
from alibabacloud_tea_openapi import models as open_api_models
from conftest import wait_until
from emulator import Emulator
from emulator.common import Credentials, FaultPlan
from emulator.runners import JOB_LABEL
from Tea.exceptions import TeaException

TESTS = Path(__file__).resolve().parents[1]
IMAGE = (
    "dsw-registry-vpc.cn-hangzhou.cr.aliyuncs.com/pai/xgboost-training:1.6.0-cpu-py36-ubuntu18.04"
)
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
FINAL = {"Succeed", "Failed", "Terminated", "InitializeFailed", "CreateFailed"}

TRAIN_PY = """\
import json, os, sys

hps = json.load(open(os.path.join(os.environ["PAI_CONFIG_DIR"], "hyperparameters.json")))
assert hps == {"epochs": "3", "learning_rate": "0.5"}, hps
assert json.load(open("/ml/input/config/hyperparameters.json")) == hps
assert os.path.samefile("/ml/code", "/ml/usercode") and os.path.islink("/ml/code")
assert sorted(os.listdir("/ml/usercode")) == ["lib", "train.py"]
assert open("/ml/input/data/train/train.csv").read() == open(os.environ["PAI_INPUT_TRAIN"]).read()
assert 1 <= int(os.environ["OMP_NUM_THREADS"]) <= os.cpu_count()  # its share of the machine
assert json.loads(os.environ["PAI_HPS"]) == hps
assert os.environ["PAI_HPS_LEARNING_RATE"] == "0.5"
assert sys.argv[1:] == ["--epochs", "3", "--learning_rate", "0.5"], sys.argv
assert os.getcwd() == os.environ["PAI_WORKING_DIR"].rstrip("/")
assert os.environ["GREETING"] == "hello"
rows = open(os.environ["PAI_INPUT_TRAIN"]).read().splitlines()
for epoch in range(int(hps["epochs"])):
    print(f"epoch={epoch} loss={1.0 / (epoch + 1):.4f} rows={len(rows)}", flush=True)
with open(os.path.join(os.environ["PAI_OUTPUT_MODEL"], "model.json"), "w") as handle:
    json.dump({"rows": len(rows)}, handle)
"""


def config(emu: Emulator, secret: str | None = None, **extra: Any) -> open_api_models.Config:
    creds = emu.credentials
    return open_api_models.Config(
        access_key_id=creds.access_key_id,
        access_key_secret=secret or creds.access_key_secret,
        endpoint=emu.pai_endpoint,
        protocol="http",
        region_id=emu.region,
        **extra,
    )


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory, docker_image: str) -> Iterator[Emulator]:
    with Emulator(
        tmp_path_factory.mktemp("emulator"), local_images={"default": docker_image}
    ) as emulator:
        yield emulator
        assert not emulator.pai.leaked_containers()  # each removed once its job ended
    assert not emulator.pai.containers()  # and the rest when the emulator stopped


@pytest.fixture(scope="module")
def client(emu: Emulator) -> PaiClient:
    return PaiClient(config(emu))


def code_dir(emu: Emulator, key: str) -> pai.Location:
    return pai.Location(location_type="oss", location_value={"Bucket": emu.bucket, "Key": key})


def upload_code(emu: Emulator, prefix: str, files: dict[str, str]) -> pai.Location:
    """Put ``files`` under ``prefix`` (ending in /): the CodeDir the PAI SDK 0.4.13 sends."""
    for name, text in files.items():
        emu.store.put(emu.bucket, prefix + name, text.encode())
    return code_dir(emu, prefix)


def upload_archive(emu: Emulator, key: str, files: dict[str, str]) -> pai.Location:
    """A .tar.gz of ``files``: the CodeDir earlier PAI SDK releases sent."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    emu.store.put(emu.bucket, key, buffer.getvalue())
    return code_dir(emu, key)


def create(
    client: PaiClient,
    emu: Emulator,
    name: str,
    command: list[str],
    *,
    image: str = IMAGE,
    ecs_spec: str = "ecs.c6.large",
    labels: dict[str, str] | None = None,
    **extra: Any,
) -> str:
    spec_extra = {k: extra.pop(k) for k in ("code_dir", "metric_definitions") if k in extra}
    request = pai.CreateTrainingJobRequest(
        training_job_name=name,
        workspace_id=emu.workspace_id,
        algorithm_spec=pai.AlgorithmSpec(
            image=image, command=command, job_type="XGBoostJob", **spec_extra
        ),
        compute_resource=pai.CreateTrainingJobRequestComputeResource(
            ecs_spec=ecs_spec, ecs_count=1
        ),
        labels=[
            pai.CreateTrainingJobRequestLabels(key=k, value=v) for k, v in (labels or {}).items()
        ],
        **extra,
    )
    return client.create_training_job(request).body.training_job_id


def wait(client: PaiClient, job_id: str, until: set[str] = FINAL, timeout: float = 20) -> Any:
    def reached() -> Any:
        job = client.get_training_job(job_id).body
        return job if job.status in until else None

    return wait_until(reached, timeout, f"job {job_id} reaching one of {sorted(until)}")


def containers_of(emu: Emulator, job_id: str) -> list[dict[str, Any]]:
    """The job's containers in the Docker engine now."""
    return [c for c in emu.pai.containers() if c["Labels"].get(JOB_LABEL) == job_id]


def logs_of(client: PaiClient, job_id: str) -> list[str]:
    return client.list_training_job_logs(job_id, pai.ListTrainingJobLogsRequest()).body.logs


def statuses(job: Any) -> list[str]:
    return [t.status for t in job.status_transitions]


def test_job_runs_the_pai_contract_and_reports_metrics_logs_and_outputs(
    emu: Emulator, client: PaiClient
) -> None:
    code = upload_code(
        emu, "pai/training_src/contract/", {"train.py": TRAIN_PY, "lib/util.py": "X = 1\n"}
    )
    emu.store.put(emu.bucket, "data/train.csv", b"a,b\n1,2\n3,4\n")
    output = f"oss://{emu.bucket}/pai/training_job/contract/model/"
    job_id = create(
        client,
        emu,
        "contract",
        ["sh", "-c", "python train.py $PAI_USER_ARGS"],
        code_dir=code,
        metric_definitions=[pai.MetricDefinition(name="loss", regex=r"loss=([0-9.]+)")],
        hyper_parameters=[
            pai.CreateTrainingJobRequestHyperParameters(name="epochs", value="3"),
            pai.CreateTrainingJobRequestHyperParameters(name="learning_rate", value="0.5"),
        ],
        input_channels=[
            pai.CreateTrainingJobRequestInputChannels(
                name="train", input_uri=f"oss://{emu.bucket}/data/train.csv"
            )
        ],
        output_channels=[
            pai.CreateTrainingJobRequestOutputChannels(name="model", output_uri=output)
        ],
        environments={"GREETING": "hello"},
        python_requirements=["numpy>=1.20"],  # in the image already: nothing to download
    )
    assert re.fullmatch(r"train[a-z0-9]{14}", job_id)
    job = wait(client, job_id)
    logs = client.list_training_job_logs(job_id, pai.ListTrainingJobLogsRequest()).body.logs
    assert job.status == "Succeed", (job.reason_message, logs)
    assert statuses(job) == [
        "Creating",
        "Created",
        "Initializing",
        "Submitted",
        "Running",
        "Succeed",
    ]
    assert all(ISO.match(t.start_time) and ISO.match(t.end_time) for t in job.status_transitions)
    assert ISO.match(job.gmt_create_time) and isinstance(job.duration, int)
    assert job.training_job_url == (
        f"https://pai.console.aliyun.com/?regionId=cn-hangzhou&workspaceId={emu.workspace_id}"
        f"#/training/jobs/{job_id}"
    )
    assert job.output_channels[0].output_uri == output
    assert [(m.name, m.value) for m in job.latest_metrics] == [("loss", pytest.approx(0.3333))]

    metrics = client.list_training_job_metrics(
        job_id, pai.ListTrainingJobMetricsRequest(name="loss", order="DESC", page_size=2)
    ).body
    assert metrics.total_count == 3
    assert [m.value for m in metrics.metrics] == [pytest.approx(0.3333), 0.5]
    latest = client.get_training_job_latest_metrics(
        job_id, pai.GetTrainingJobLatestMetricsRequest(names="loss")
    ).body.metrics
    assert [(m.name, ISO.match(m.timestamp) is not None) for m in latest] == [("loss", True)]

    assert logs[0] == "Installing Python requirements: numpy>=1.20"  # then pip's own lines
    assert logs[-3:] == [
        "epoch=0 loss=1.0000 rows=3",
        "epoch=1 loss=0.5000 rows=3",
        "epoch=2 loss=0.3333 rows=3",
    ]
    pages = [
        client.list_training_job_logs(
            job_id, pai.ListTrainingJobLogsRequest(page_number=n, page_size=2)
        ).body
        for n in range(1, len(logs) // 2 + 2)
    ]
    total = [str(len(logs))] * len(pages)
    assert [p.total_count for p in pages] == total  # the model types it as a string
    assert [line for p in pages for line in p.logs] == logs
    model = emu.store.get(emu.bucket, "pai/training_job/contract/model/model.json")
    assert json.loads(model or b"{}") == {"rows": 3}


def test_list_filters_by_labels_and_name_and_names_are_not_unique(
    emu: Emulator, client: PaiClient
) -> None:
    first = create(client, emu, "twin-job", ["true"], labels={"sweep": "s1", "trial": "0"})
    second = create(client, emu, "twin-job", ["true"], labels={"sweep": "s1", "trial": "1"})
    other = create(client, emu, "lonely-job", ["true"], labels={"sweep": "s2"})
    assert first != second

    def listed(**query: Any) -> list[str]:
        body = client.list_training_jobs(
            pai.ListTrainingJobsRequest(workspace_id=emu.workspace_id, **query)
        ).body
        assert body.total_count == len(body.training_jobs)
        return [j.training_job_id for j in body.training_jobs]

    assert set(listed(training_job_name="twin-job")) == {first, second}
    assert listed(labels={"sweep": "s1"}, sort_by="GmtCreateTime", order="ASC") == [first, second]
    assert listed(labels={"sweep": "s1", "trial": "1"}) == [second]
    assert listed(labels={"sweep": "s2"}) == [other]
    assert listed(labels={"sweep": "nope"}) == []
    assert listed(training_job_id=other) == [other]
    page = client.list_training_jobs(
        pai.ListTrainingJobsRequest(labels={"sweep": "s1"}, page_size=1, page_number=2)
    ).body
    assert page.total_count == 2 and len(page.training_jobs) == 1
    for job_id in (first, second, other):
        assert wait(client, job_id).status == "Succeed"
    assert set(listed(status="Succeed", labels={"sweep": "s1"})) == {first, second}
    item = client.list_training_jobs(pai.ListTrainingJobsRequest(training_job_id=first)).body
    assert {(label.key, label.value) for label in item.training_jobs[0].labels} == {
        ("sweep", "s1"),
        ("trial", "0"),
    }


def test_stop_terminates_the_job_and_removes_its_container(
    emu: Emulator, client: PaiClient
) -> None:
    script = "import time; print('started', flush=True); time.sleep(60)"
    job_id = create(client, emu, "sleeper", ["python", "-c", script])
    assert wait(client, job_id, until={"Running"}).status == "Running"
    wait_until(lambda: logs_of(client, job_id), 10, "the job's first log line")
    (container,) = containers_of(emu, job_id)
    assert container["State"] == "running"
    client.stop_training_job(job_id)
    job = wait(client, job_id)
    assert job.status == "Terminated"
    assert statuses(job)[-3:] == ["Running", "Stopping", "Terminated"]
    assert not containers_of(emu, job_id)
    client.stop_training_job(job_id)  # stopping a finished job changes nothing
    assert wait(client, job_id).status == "Terminated"


def test_a_stopped_job_is_stopping_while_its_process_is_being_killed(emu: Emulator) -> None:
    client = PaiClient(config(emu, signature_algorithm="v2"))  # as the PAI SDK signs
    # The job's process group is led by a shell ignoring TERM (exec: no wrapper shell in
    # between to die of it), so only the KILL one grace period after the TERM ends it.
    stubborn = "trap '' TERM; echo started; sleep 60"
    job_id = create(client, emu, "stubborn", ["exec", "sh", "-c", stubborn])
    assert wait(client, job_id, until={"Running"}).status == "Running"
    wait_until(lambda: logs_of(client, job_id), 10, "the job's first log line")
    client.stop_training_job(job_id)
    stopping = client.get_training_job(job_id).body
    assert stopping.status == "Stopping"
    assert stopping.reason_code is None
    listed = client.list_training_jobs(pai.ListTrainingJobsRequest(status="Stopping")).body
    assert job_id in [j.training_job_id for j in listed.training_jobs]
    client.stop_training_job(job_id)  # stopping a stopping job changes nothing
    job = wait(client, job_id)
    assert job.status == "Terminated" and job.reason_code == "JobStoppedByUser"
    assert statuses(job)[-3:] == ["Running", "Stopping", "Terminated"]
    stopped = job.status_transitions[-2]
    assert stopped.end_time == job.status_transitions[-1].start_time
    assert statuses(job).count("Stopping") == 1


def test_a_job_stopped_before_it_runs_is_stopping_then_terminated(
    emu: Emulator, client: PaiClient
) -> None:
    emu.pai.admit.clear()  # held before it runs
    try:
        job_id = create(client, emu, "early-stop", ["sleep", "60"])
        assert client.get_training_job(job_id).body.status in (
            "Creating",
            "Created",
            "Initializing",
        )
        client.stop_training_job(job_id)
        job = wait(client, job_id)
    finally:
        emu.pai.admit.set()
    assert job.status == "Terminated"
    assert statuses(job)[-2:] == ["Stopping", "Terminated"]
    assert "Running" not in statuses(job)


FAILURES: dict[str, tuple[list[str], dict[str, Any], str, str, str]] = {
    "exit": (["sh", "-c", "echo boom; exit 3"], {}, "Failed", "JobFailed", "exit code 3"),
    "timeout": (["sleep", "30"], {"seconds": 1}, "Failed", "JobTimeout", "InSeconds=1"),
    "image": (["true"], {"image": "docker.io/library/python:3"}, "Failed", "ImagePullBackOff", ""),
    "code": (
        ["true"],
        {"code": "missing/source.tar.gz"},
        "InitializeFailed",
        "NoSuchKey",
        "missing",
    ),
    "code-prefix-without-slash": (  # a key without / names one object: there is none
        ["true"],
        {"code": "pai/training_src/contract"},
        "InitializeFailed",
        "NoSuchKey",
        "named with a trailing /",
    ),
    "pip": (
        ["true"],
        {"requirement": "no-such-dist==1.0"},
        "Failed",
        "RequirementsInstallFailed",
        "",
    ),
}


@pytest.mark.parametrize("case", FAILURES)
def test_failures_carry_a_reason(emu: Emulator, client: PaiClient, case: str) -> None:
    command, extra, status, reason, detail = FAILURES[case]
    kwargs: dict[str, Any] = {}
    if "seconds" in extra:
        kwargs["scheduler"] = pai.CreateTrainingJobRequestScheduler(
            max_running_time_in_seconds=extra["seconds"]
        )
    if "image" in extra:
        kwargs["image"] = extra["image"]
    if "code" in extra:
        upload_code(emu, "pai/training_src/contract/", {"train.py": TRAIN_PY})
        kwargs["code_dir"] = code_dir(emu, extra["code"])
    if "requirement" in extra:  # pip finds nothing without an index: no network, no install
        kwargs["python_requirements"] = [extra["requirement"]]
        kwargs["environments"] = {"PIP_NO_INDEX": "1"}
    job_id = create(client, emu, f"fail-{case}", command, **kwargs)
    job = wait(client, job_id)
    assert (job.status, job.reason_code) == (status, reason)
    assert detail in job.reason_message
    assert job.status_transitions[-1].reason_code == reason
    if status == "InitializeFailed":  # no instance ever ran: the SDK's log printer sees this
        with pytest.raises(TeaException) as caught:
            client.list_training_job_logs(job_id, pai.ListTrainingJobLogsRequest())
        assert caught.value.code == "TRAINING_JOB_INSTANCE_NOT_FOUND"
    if case == "pip":
        assert logs_of(client, job_id)[0] == "Installing Python requirements: no-such-dist==1.0"


def test_code_dir_names_a_prefix_an_archive_or_one_file(emu: Emulator, client: PaiClient) -> None:
    """What the SDKs send: 0.4.13 a prefix of files (or one file's key for a one-file
    source_dir), earlier releases a .tar.gz that PAI unpacks."""
    forms = {
        "prefix": upload_code(emu, "pai/training_src/forms/", {"a.py": "", "sub/b.py": ""}),
        "archive": upload_archive(
            emu, "pai/training_src/old/source.tar.gz", {"a.py": "", "sub/b.py": ""}
        ),
        "file": upload_code(emu, "pai/training_src/single/", {"a.py": ""}),
    }
    forms["file"].location_value["Key"] += "a.py"
    jobs = {
        form: create(client, emu, f"code-{form}", ["find", ".", "-type", "f"], code_dir=location)
        for form, location in forms.items()
    }
    seen = {}
    for form, job_id in jobs.items():
        assert wait(client, job_id).status == "Succeed", form
        seen[form] = sorted(logs_of(client, job_id))
    assert seen == {
        "prefix": ["./a.py", "./sub/b.py"],
        "archive": ["./a.py", "./sub/b.py"],
        "file": ["./a.py"],
    }


def test_shutdown_removes_the_containers_of_jobs_still_running(
    tmp_path: Path, docker_image: str
) -> None:
    with Emulator(tmp_path, local_images={"default": docker_image}) as emu:
        client = PaiClient(config(emu))
        job_id = create(client, emu, "left-running", ["sh", "-c", "echo up; sleep 60"])
        wait_until(lambda: client.get_training_job(job_id).body.status == "Running", 20)
        wait_until(lambda: logs_of(client, job_id), 20, "the job's first log line")
        assert containers_of(emu, job_id)
    assert not emu.pai.containers()
    assert emu.job(job_id)["Status"] == "Terminated"


def test_an_image_without_a_local_stand_in_cannot_be_pulled(
    tmp_path: Path, docker_image: str
) -> None:
    with Emulator(tmp_path, local_images={IMAGE: docker_image}) as emu:  # only IMAGE maps
        client = PaiClient(config(emu))
        other = IMAGE.split("/pai/")[0] + "/pai/pytorch-training:1.12-cpu-py39-ubuntu20.04"
        job = wait(client, create(client, emu, "unmapped", ["true"], image=other))
        assert (job.status, job.reason_code) == ("Failed", "ImagePullBackOff")
        assert "local_images" in job.reason_message
        assert wait(client, create(client, emu, "mapped", ["true"])).status == "Succeed"


def test_bad_requests_are_rejected(emu: Emulator, client: PaiClient) -> None:
    with pytest.raises(TeaException) as caught:
        create(client, emu, "too-big", ["true"], ecs_spec="ecs.nope.huge")
    assert (caught.value.status_code, caught.value.code) == (400, "InvalidParameter")
    assert "ecs.nope.huge" in caught.value.message
    with pytest.raises(TeaException) as caught:
        create(client, emu, "", ["true"])
    assert (caught.value.status_code, caught.value.code) == (400, "MissingTrainingJobName")
    with pytest.raises(TeaException) as caught:
        client.get_training_job("train-does-not-exist")
    assert (caught.value.status_code, caught.value.code) == (404, "TRAINING_JOB_NOT_FOUND")


def test_wrong_credentials_are_refused_without_leaking_the_secret(emu: Emulator) -> None:
    wrong = "not-the-secret-at-all"
    with pytest.raises(TeaException) as caught:
        PaiClient(config(emu, secret=wrong)).list_training_jobs(pai.ListTrainingJobsRequest())
    assert (caught.value.status_code, caught.value.code) == (403, "SignatureDoesNotMatch")
    assert wrong not in str(caught.value) and emu.credentials.access_key_secret not in str(
        caught.value
    )
    unknown = config(emu)
    unknown.access_key_id = "LTAI-nobody"
    with pytest.raises(TeaException) as caught:
        PaiClient(unknown).list_training_jobs(pai.ListTrainingJobsRequest())
    assert caught.value.code == "InvalidAccessKeyId.NotFound"


def test_the_pai_sdks_roa_signature_is_accepted_and_checked(
    emu: Emulator, client: PaiClient
) -> None:
    roa = PaiClient(config(emu, signature_algorithm="v2"))
    request = pai.ListTrainingJobsRequest(
        workspace_id=emu.workspace_id, labels={"sweep": "a b+c"}, training_job_name=""
    )
    assert roa.list_training_jobs(request).body.total_count == 0
    assert client.list_training_jobs(request).body.total_count == 0  # ACS3 still works

    wrong = "not-the-secret-at-all"
    for algorithm, signed in (
        ("v2", "server string to sign is:GET\napplication/json\n"),
        (None, "server string to sign is:ACS3-HMAC-SHA256\n"),
    ):
        refused = PaiClient(config(emu, secret=wrong, signature_algorithm=algorithm))
        with pytest.raises(TeaException) as caught:
            refused.list_training_jobs(pai.ListTrainingJobsRequest())
        assert (caught.value.status_code, caught.value.code) == (403, "SignatureDoesNotMatch")
        assert signed in caught.value.data["Message"]  # the signature this client sent
        assert caught.value.data["RequestId"] and caught.value.data["HostId"]
        assert wrong not in str(caught.value)
        assert emu.credentials.access_key_secret not in str(caught.value)

    unknown = config(emu, signature_algorithm="v2")
    unknown.access_key_id = "LTAI-nobody"
    with pytest.raises(TeaException) as caught:
        PaiClient(unknown).list_training_jobs(pai.ListTrainingJobsRequest())
    assert (caught.value.status_code, caught.value.code) == (400, "InvalidAccessKeyId.NotFound")


def roa_request(
    emu: Emulator, query: dict[str, str], date: str | None = None
) -> urllib.request.Request:
    """A ListTrainingJobs request signed by tea-openapi's own ROA helpers (the reference)."""
    from alibabacloud_tea_openapi.utils import Utils

    headers = {
        "date": date or formatdate(usegmt=True),
        "accept": "application/json",
        "x-acs-signature-nonce": os.urandom(8).hex(),
        "x-acs-signature-method": "HMAC-SHA1",
        "x-acs-signature-version": "1.0",
        "x-acs-version": "2022-01-12",
        "x-acs-action": "ListTrainingJobs",
    }
    signed = SimpleNamespace(
        method="GET", pathname="/api/v1/trainingjobs", headers=headers, query=query
    )
    creds = emu.credentials
    signature = Utils.get_roasignature(Utils.get_string_to_sign(signed), creds.access_key_secret)
    headers["authorization"] = f"acs {creds.access_key_id}:{signature}"
    return urllib.request.Request(
        f"http://{emu.pai_endpoint}/api/v1/trainingjobs?" + urlencode(query), headers=headers
    )


DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy for 127.0.0.1


def refusal(request: urllib.request.Request) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as caught:
        DIRECT.open(request, timeout=10)
    return caught.value.code, json.loads(caught.value.read())["Code"]


def test_the_roa_signature_covers_the_query_date_and_nonce(emu: Emulator) -> None:
    query = {"PageSize": "1", "TrainingJobName": "", "Labels": '{"k": "v w"}'}
    request = roa_request(emu, query)
    with DIRECT.open(request, timeout=10) as response:
        assert json.loads(response.read())["TotalCount"] == 0
    assert refusal(request) == (400, "SignatureNonceUsed")  # the same request again
    tampered = roa_request(emu, query)
    tampered.full_url = tampered.full_url.replace("PageSize=1", "PageSize=2")
    assert refusal(tampered) == (403, "SignatureDoesNotMatch")
    stale = roa_request(emu, query, date=formatdate(time.time() - 3600, usegmt=True))
    assert refusal(stale) == (400, "InvalidTimeStamp.Expired")
    unsigned = roa_request(emu, query)
    unsigned.headers["Authorization"] = "acs no-colon-here"
    assert refusal(unsigned) == (400, "IncompleteSignature")


def test_security_token_is_checked(tmp_path: Path) -> None:
    creds = Credentials(security_token="sts-token-123")
    with Emulator(tmp_path, credentials=creds) as emu:
        with pytest.raises(TeaException) as caught:
            PaiClient(config(emu)).list_training_jobs(pai.ListTrainingJobsRequest())
        assert caught.value.code == "InvalidSecurityToken.MismatchWithAccessKey"
        body = PaiClient(config(emu, security_token="sts-token-123")).list_training_jobs(
            pai.ListTrainingJobsRequest()
        )
        assert body.body.total_count == 0


def test_faults_are_what_the_client_sees(emu: Emulator, client: PaiClient) -> None:
    request = pai.ListTrainingJobsRequest()
    try:
        emu.faults = FaultPlan(rate=1.0, kinds=("throttle",))
        with pytest.raises(TeaException) as caught:
            client.list_training_jobs(request)
        assert (caught.value.status_code, caught.value.code) == (400, "Throttling.User")
        emu.faults = FaultPlan(rate=1.0, kinds=("error",))
        for _ in range(2):
            with pytest.raises(TeaException) as caught:
                client.list_training_jobs(request)
            assert caught.value.code in ("InternalError", "ServiceUnavailable")
        emu.faults = FaultPlan(rate=1.0, kinds=("drop",), seed=1)
        with pytest.raises(TeaException):
            client.list_training_jobs(request)
    finally:
        emu.faults = FaultPlan()
    records = emu.log.records(service="pai", action="ListTrainingJobs")[-4:]
    assert [r.fault for r in records] == ["throttle", "error", "error", "drop"]
    assert records[-1].status == 0
    assert client.list_training_jobs(request).body.total_count is not None


def test_list_images_filters_official_images_by_label(emu: Emulator) -> None:
    workspace = WorkspaceClient(config(emu))
    official = "system.official=true,system.supported.dlc=true"

    def images(**query: Any) -> list[Any]:
        request = ws_models.ListImagesRequest(verbose=True, workspace_id="0", **query)
        return workspace.list_images(request).body.images

    cpu = images(labels=f"{official},system.chipType=CPU", name="xgboost")
    assert [i.image_uri for i in cpu] == [IMAGE]
    labels = {label.key: label.value for label in cpu[0].labels}
    assert labels["system.framework"] == "XGBoost 1.6.0"
    assert labels["system.chipType"] == "CPU"
    gpu = images(labels=f"{official},system.chipType=GPU", name="pytorch")
    assert gpu and all(":" in i.name and "-gpu-" in i.image_uri for i in gpu)
    assert [i.name for i in images(labels="system.framework=XGBoost 1.6.0")] == [
        "xgboost-training:1.6.0-cpu-py36-ubuntu18.04"
    ]
    assert images(labels=f"{official},system.chipType=TPU") == []
    terse = workspace.list_images(ws_models.ListImagesRequest(name="xgboost")).body.images
    assert terse[0].labels == []  # labels only with Verbose=true


def test_python_m_emulator_prints_its_endpoints_and_stops_on_sigterm(
    tmp_path: Path, docker_image: str
) -> None:
    image = f"default={docker_image}"
    process = subprocess.Popen(
        [sys.executable, "-m", "emulator", "--root", str(tmp_path), "--image", image],
        cwd=TESTS,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        info = json.loads(process.stdout.readline())
        assert info["bucket"] == "paiexp-test" and info["oss_endpoint"].startswith("http://")
        client = PaiClient(
            open_api_models.Config(
                access_key_id=info["access_key_id"],
                access_key_secret=info["access_key_secret"],
                endpoint=info["pai_endpoint"],
                protocol="http",
                region_id=info["region"],
            )
        )
        assert client.list_training_jobs(pai.ListTrainingJobsRequest()).body.total_count == 0
        account: Any = SimpleNamespace(workspace_id=info["workspace_id"])
        job_id = create(
            client,
            account,
            "cli",
            ["sh", "-c", "test -d /ml/usercode && test -f /.dockerenv && echo in-a-container"],
        )
        assert wait(client, job_id).status == "Succeed"
        assert logs_of(client, job_id) == ["in-a-container"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def test_python_m_emulator_refuses_a_malformed_image_mapping(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "emulator", "--root", str(tmp_path), "--image", "no-tag"],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--image 'no-tag': expected URI=TAG or default=TAG" in done.stderr
