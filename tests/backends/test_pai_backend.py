"""backend=pai end to end: the real PaiStudio client and oss2 against the local PAI + OSS emulator.

The emulator (tests/emulator) speaks both wire protocols over real HTTP, checks every
request's signature, runs each job under the PAI contract, and logs every request. Jobs of
the XGBoost example run in containers of the test image, as PAI runs them; the synthetic
jobs of the scheduling tests, as host processes (faster, and all those tests need).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, assert_nothing_started, clean_env, run_paiexp
from emulator import Emulator
from emulator.store import split_uri
from gates import Gates
from sweep_helpers import (
    children_by_trial,
    let_end_once_reported,
    load_study,
    sweep_runs,
    synthetic_project,
    third_trial_pruned,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "cloud") as emulator:
        yield emulator


@pytest.fixture
def container_cloud(tmp_path: Path, docker_image: str) -> Iterator[Emulator]:
    with Emulator(tmp_path / "cloud", local_images={"default": docker_image}) as emulator:
        yield emulator
        assert not emulator.pai.leaked_containers()


def pai_env(cloud: Emulator, secret: str | None = None) -> dict[str, str]:
    return clean_env(
        ALIBABA_CLOUD_ACCESS_KEY_ID=cloud.credentials.access_key_id,
        ALIBABA_CLOUD_ACCESS_KEY_SECRET=secret or cloud.credentials.access_key_secret,
    )


def pai_overrides(cloud: Emulator, poll: float = 0.3) -> list[str]:
    return [
        "backend=pai",
        f"backend.endpoint={cloud.pai_endpoint}",
        "backend.protocol=http",
        f"backend.workspace_id={cloud.workspace_id}",
        f"backend.oss.bucket={cloud.bucket}",
        f"backend.oss.endpoint={cloud.oss_endpoint}",
        f"backend.poll_interval={poll}",
        "backend.log_interval=0.5",
        "backend.retry.base_delay=0.05",
        "backend.retry.max_delay=0.5",
        f"backend.image={cloud.default_image}",
        "job.instance_type=ecs.c6.large",
    ]


def project_with_pai(root: Path) -> Path:
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, root / name)
    return root


def code_uploads(cloud: Emulator) -> Counter[str]:
    """How often each object of the jobs' code (``training_src/``) was put into OSS."""
    uploads = [r.path for r in cloud.log.records("oss") if r.method in ("PUT", "POST")]
    return Counter(path for path in uploads if "training_src" in path)


def assert_code_uploaded_once(cloud: Emulator) -> Counter[str]:
    """The code's files and their marker were each put once, whatever the number of jobs."""
    uploads = code_uploads(cloud)
    assert uploads and set(uploads.values()) == {1}, uploads
    assert sum(path.endswith(".paiexp-complete") for path in uploads) == 1, uploads
    return uploads


def created_jobs(cloud: Emulator) -> Counter[str]:
    """How many PAI jobs the emulator holds per TrainingJobName."""
    return Counter(job["TrainingJobName"] for job in cloud.jobs())


@pytest.mark.timeout(660)  # its launcher may take up to 600 s
def test_xgb_sweep_on_pai(container_cloud: Emulator, tmp_path: Path) -> None:
    cloud = container_cloud
    root = project_with_pai(tmp_path / "project")
    started = time.monotonic()
    result = run_paiexp(
        root,
        "+sweep=xgb",
        "sweep.n_trials=6",
        "sweep.parallelism=3",
        *pai_overrides(cloud),
        env=pai_env(cloud),
        timeout=600,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    study = load_study(root, "xgb")
    assert [t.state.name for t in study.trials].count("COMPLETE") + [
        t.state.name for t in study.trials
    ].count("PRUNED") == 6
    parents, children = sweep_runs(root)
    assert len(parents) == 1 and len(children) == 6
    for child in children:
        tags = child.data.tags
        if tags["paiexp.trial_state"] == "PRUNED":
            continue
        model_uri = tags["paiexp.model_uri"]
        assert model_uri.startswith(f"oss://{cloud.bucket}/paiexp/training_job/")
        assert child.data.params["paiexp.model_uri"] == model_uri
        assert tags["paiexp.console_url"].startswith("https://pai.console.aliyun.com/")
        bucket, prefix = split_uri(model_uri)
        assert f"{prefix}model.json" in list(cloud.store.keys(bucket, prefix))
        assert child.data.metrics["test-auc"] > 0.9
    run_of_job = {c.data.tags["paiexp.job_name"]: c.info.run_id for c in children}
    for job in cloud.jobs():  # each job knows its trial's run, study and trial number
        labels = {label["Key"]: label["Value"] for label in job["Labels"]}
        assert labels["paiexp-run"] == run_of_job[job["TrainingJobName"]]
        assert labels["paiexp-study"] == "xgb" and labels["paiexp-trial"].isdigit()
    assert created_jobs(cloud) == Counter(
        {t.user_attrs["paiexp:job_name"]: 1 for t in study.trials}
    )

    log = cloud.log
    uploaded = assert_code_uploaded_once(cloud)  # for all six trials
    code_dirs = {json.dumps(job["AlgorithmSpec"]["CodeDir"]) for job in cloud.jobs()}
    (code_dir,) = [json.loads(text)["LocationValue"] for text in code_dirs]
    assert code_dir["Key"].endswith("/")  # a prefix of files, as the PAI SDK sends it
    assert f"/{cloud.bucket}/{code_dir['Key']}train.py" in uploaded
    statuses = [r for r in log.records("pai", "ListTrainingJobs") if "Labels" in r.query]
    gets = log.records("pai", "GetTrainingJob")
    # status: one labelled listing per tick for all jobs, never one call per job
    assert len(gets) <= 6 + 1, [g.path for g in gets]
    ticks_bound = elapsed / 0.3 + 2 * 6 + 5
    assert len(statuses) <= ticks_bound, (len(statuses), ticks_bound)

    # paiexp download RUN_ID DEST fetches the model from OSS
    finished = next(c for c in children if c.data.tags["paiexp.trial_state"] == "COMPLETE")
    dest = tmp_path / "downloaded"
    fetched = run_paiexp(root, "download", finished.info.run_id, str(dest), env=pai_env(cloud))
    assert fetched.returncode == 0, fetched.stderr
    assert (dest / "model.json").stat().st_size > 1000


def test_pruned_trials_are_stopped_on_pai(cloud: Emulator, tmp_path: Path) -> None:
    steps = 5
    gates = Gates(tmp_path / "gates")  # each job runs until the test opens its gate
    root = synthetic_project(
        tmp_path,
        third_trial_pruned({"x": "interval(-3, 3)", "duration": 0.2, "steps": steps}),
        {"environments": gates.env()},
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "+sweep=syn", *pai_overrides(cloud)],
        cwd=root,
        env=pai_env(cloud),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    let_end_once_reported(gates, root, steps)
    _, err = launcher.communicate(timeout=120)  # the third job is held: it cannot end itself
    assert launcher.returncode == 0, err[-3000:]
    assert len(gates.opened()) == 2 and len(gates.held()) == 1  # the third, stopped held
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    pruned_id = study.trials[2].user_attrs["paiexp:job_id"]
    stops = cloud.log.records("pai", "StopTrainingJob")
    assert [r.path for r in stops] == [f"/api/v1/trainingjobs/{pruned_id}/stop"]
    job = cloud.job(pruned_id)
    assert job["Status"] == "Terminated"
    assert [t["Status"] for t in job["StatusTransitions"]][-1] == "Terminated"
    assert children_by_trial(root)["2"].info.status == "KILLED"


def test_a_sweep_rides_out_injected_faults(cloud: Emulator, tmp_path: Path) -> None:
    root = synthetic_project(
        tmp_path,
        {"params": {"x": "interval(-1, 1)", "duration": 0.5}, "n_trials": 6, "parallelism": 2},
    )
    cloud.faults.rate = 0.2
    result = run_paiexp(root, "+sweep=syn", *pai_overrides(cloud), env=pai_env(cloud))
    cloud.faults.rate = 0.0
    assert result.returncode == 0, result.stderr[-3000:]
    faults = Counter(r.fault for r in cloud.log.records() if r.fault)
    requests = len(cloud.log.records())
    assert sum(faults.values()) >= 0.1 * requests and len(faults) >= 2, (faults, requests)
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    parents, children = sweep_runs(root)
    assert len(parents) == 1 and len(children) == 6
    assert all(c.info.status == "FINISHED" for c in children)
    names = {t.user_attrs["paiexp:job_name"] for t in study.trials}
    assert created_jobs(cloud) == Counter(dict.fromkeys(names, 1))  # no job created twice


def test_wrong_credentials_are_one_clear_error_and_never_shown(
    cloud: Emulator, tmp_path: Path
) -> None:
    root = project_with_pai(tmp_path / "project")
    wrong = "wrong-secret-value-0123456789"
    result = run_paiexp(root, "+sweep=xgb", *pai_overrides(cloud), env=pai_env(cloud, secret=wrong))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paiexp: error: PAI refused AccessKey ..."), (
        lines
    )
    assert "SignatureDoesNotMatch" in lines[0]
    assert "Traceback" not in result.stderr
    for secret in (wrong, cloud.credentials.access_key_secret):
        assert secret not in result.stdout + result.stderr
        for path in [*root.rglob("*"), *cloud.root.rglob("*")]:
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    assert_nothing_started(root)
    assert not cloud.jobs()


def test_a_killed_launcher_reattaches_to_running_pai_jobs(cloud: Emulator, tmp_path: Path) -> None:
    gates = Gates(tmp_path / "gates")  # each job runs (a host process) until its gate opens
    root = synthetic_project(
        tmp_path,
        {"params": {"x": "interval(-1, 1)"}, "n_trials": 5, "parallelism": 3},
        {"environments": gates.env()},
    )
    args = [sys.executable, "-m", "paiexp", "+sweep=syn", *pai_overrides(cloud)]
    launcher = subprocess.Popen(
        args, cwd=root, env=pai_env(cloud), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    held = gates.wait_held(3)  # the sweep's three slots: three jobs held running
    assert launcher.poll() is None, launcher.communicate()[1][-3000:]
    running = {j["TrainingJobId"] for j in cloud.jobs() if j["Status"] == "Running"}
    assert len(running) == 3  # the jobs in flight as the launcher is killed
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    assert sorted(gates.held()) == sorted(held)  # none let end: they run through the crash

    with gates.all_open():
        result = run_paiexp(root, "+sweep=syn", *pai_overrides(cloud), env=pai_env(cloud))
    assert result.returncode == 0, result.stderr[-3000:]
    study = load_study(root)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5
    ids = {t.user_attrs["paiexp:job_id"] for t in study.trials}
    assert running <= ids  # the jobs that ran through the crash were adopted, not redone
    names = [t.user_attrs["paiexp:job_name"] for t in study.trials]
    assert created_jobs(cloud) == Counter(dict.fromkeys(names, 1))
    _, children = sweep_runs(root)
    assert sorted(c.data.tags["paiexp.trial_number"] for c in children) == [
        str(i) for i in range(5)
    ]
    assert all(c.info.status == "FINISHED" for c in children)


def test_a_single_run_on_pai_is_labelled_with_its_mlflow_run(
    container_cloud: Emulator, tmp_path: Path
) -> None:
    cloud = container_cloud
    root = project_with_pai(tmp_path / "project")
    result = run_paiexp(
        root, *pai_overrides(cloud), "job.hyperparameters.n_estimators=20", env=pai_env(cloud)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (job,) = cloud.jobs()
    labels = {label["Key"]: label["Value"] for label in job["Labels"]}
    from conftest import all_runs

    (run,) = all_runs(root)
    assert labels["paiexp-run"] == run.info.run_id
    assert run.data.tags["paiexp.job_id"] == job["TrainingJobId"]
    assert run.data.metrics["test-auc"] > 0.9
    assert "paiexp.metric_mismatch" not in run.data.tags  # log and service agree
    # billed as PAI bills: from its first Running to its end, as StatusTransitions say
    from paiexp.backends.pai_api import running_span

    started, ended = running_span(job)
    assert started is not None and ended is not None
    assert run.data.metrics["instance_hours"] == pytest.approx((ended - started) / 3600)


def test_images_lists_official_training_images(cloud: Emulator, tmp_path: Path) -> None:
    root = project_with_pai(tmp_path / "project")
    result = run_paiexp(
        root, "images", "--framework", "xgboost", *pai_overrides(cloud)[:5], env=pai_env(cloud)
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines and all("xgboost" in line.lower() for line in lines), lines
    listing = cloud.log.records("pai", "ListImages")
    assert listing and "system.official=true" in json.dumps(listing[0].query)


def test_a_job_pai_cannot_start_fails_with_its_reason(cloud: Emulator, tmp_path: Path) -> None:
    root = project_with_pai(tmp_path / "project")
    overrides = [*pai_overrides(cloud), "backend.image=registry.example.com/no/such:image"]
    result = run_paiexp(root, *overrides, env=pai_env(cloud))
    assert result.returncode == 1
    from conftest import all_runs

    (run,) = all_runs(root)
    assert run.info.status == "FAILED"
    reason = run.data.tags["paiexp.failure_reason"]
    assert reason.startswith("PAI Failed (ImagePullBackOff: "), reason
    assert "registry.example.com/no/such:image" in reason


def test_a_rejected_instance_type_ends_the_sweep_at_once(cloud: Emulator, tmp_path: Path) -> None:
    root = project_with_pai(tmp_path / "project")
    overrides = [*pai_overrides(cloud), "job.instance_type=ecs.no-such-type"]
    result = run_paiexp(root, "+sweep=xgb", "sweep.n_trials=4", *overrides, env=pai_env(cloud))
    assert result.returncode == 1
    assert "submission rejected: PAI CreateTrainingJob rejected: InvalidParameter" in result.stderr
    assert "ecs.no-such-type" in result.stderr
    study = load_study(root, "xgb")
    assert [t.state.name for t in study.trials] == ["FAIL"]  # no second trial tried
    assert not cloud.jobs()


def test_missing_credentials_are_one_clear_error(cloud: Emulator, tmp_path: Path) -> None:
    root = project_with_pai(tmp_path / "project")
    env = {k: v for k, v in clean_env().items() if not k.startswith("ALIBABA_CLOUD_")}
    env["HOME"] = str(tmp_path)  # no CLI profile either
    result = run_paiexp(root, *pai_overrides(cloud), env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "paiexp: error: no Alibaba Cloud credentials: set ALIBABA_CLOUD_ACCESS_KEY_ID and "
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET (and ALIBABA_CLOUD_SECURITY_TOKEN for STS), or "
        "configure the Alibaba Cloud CLI profile"
    ]
    assert_nothing_started(root)
