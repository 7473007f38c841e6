"""The sweep's tracking channel: typed calls applied to a real MLflow (a temporary SQLite file)."""

from __future__ import annotations

import dataclasses
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import assert_stays
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.tracking._tracking_service import client as mlflow_service_client

from paiexp.backends.base import JobHandle, JobState, JobStatus
from paiexp.config.record import make_record
from paiexp.config.schema import LocalBackendConfig
from paiexp.config.spec import JobSpec
from paiexp.metrics.extraction import MetricPoint
from paiexp.sweep import tracking_worker
from paiexp.sweep.opening import LEADER_ATTR, PARENT_RUN_ATTR
from paiexp.sweep.ownership import study_storage
from paiexp.sweep.records import HEARTBEAT, OWNER
from paiexp.sweep.study import create_storage
from paiexp.sweep.tracking import SweepTracker
from paiexp.sweep.tracking_messages import (
    Close,
    Drawn,
    FinishChild,
    FinishParent,
    LogPoints,
    NewParentRun,
    OpenParent,
    Resumed,
    RunCreated,
    Sent,
    StartAndFinishChild,
    StartChild,
    TrackingSetup,
    TrialRecord,
    UpdateBest,
)
from paiexp.sweep.tracking_queue import CallQueue
from paiexp.sweep.tracking_worker import TrackingWorker
from paiexp.tracking.mlflow_tracker import MAX_TAG_CHARS, PARAM_MAX_CHARS, MlflowTracker
from paiexp.tracking.monitor import JobResult
from paiexp.tracking.sqlite_store import (
    create_sqlite_database,
    leave_write_ahead,
    template_path,
    write_ahead,
)


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """These trackers run in this process: MLflow puts a new local store's artifacts under
    the working directory's mlruns/, which is the test's, not the repository's."""
    monkeypatch.chdir(tmp_path)


def setup_in(root: Path, tracker_uri: str | None = None) -> TrackingSetup:
    storage = str(root / "optuna.journal")
    optuna.create_study(study_name="syn", storage=create_storage(storage))
    return TrackingSetup(
        tracker_uri=tracker_uri or f"sqlite:///{root / 'mlflow.db'}",
        experiment="channel",
        storage=storage,
        study_name="syn",
        backend=LocalBackendConfig(),  # where finished jobs' own MLflow stores would be
        base_dir=root,
        overrides=(),
        source=None,
    )


def open_parent(sweep_id: str, known_run_id: str | None, *, leader: bool = True) -> OpenParent:
    new = NewParentRun(
        run_name="syn",
        tags={"paiexp.long": "t" * (MAX_TAG_CHARS + 100)},
        params={"space.x": "p" * (PARAM_MAX_CHARS + 100)},
    )
    invocation = {"paiexp.invocation": "python -m paiexp"}
    return OpenParent(sweep_id, known_run_id, leader, new, invocation)


def start_child(job_name: str, number: int, *, adopted: bool = False) -> StartChild:
    spec = JobSpec(name=job_name, command="python train.py", hyperparameters={"x": str(number)})
    data = {"backend": {"name": "local"}, "job": {"name": "syn"}}
    tags = {
        "mlflow.runName": f"trial-{number}",
        "paiexp.trial_number": str(number),
        "paiexp.sweep_id": "sweep-1",
    }
    return StartChild(job_name, TrialRecord(spec, data), tags, adopted)


def test_parent_run_is_found_again_and_one_child_is_tagged_best(tmp_path: Path) -> None:
    setup = setup_in(tmp_path)
    worker = TrackingWorker(setup)
    worker.apply(open_parent("sweep-1", None))
    parent_id = worker.parent_run_id
    assert worker.study.user_attrs[PARENT_RUN_ATTR] == parent_id
    created = [worker.apply(start_child(f"job-{n}", n)) for n in range(2)]
    assert created == [RunCreated(f"job-{n}", worker.runs[f"job-{n}"]) for n in range(2)]
    worker.apply(UpdateBest({"best_score": 0.5}, 1, {"paiexp.best_trial": "0"}, "job-0"))
    worker.apply(UpdateBest({"best_score": 0.25}, 2, {"paiexp.best_trial": "1"}, "job-1"))

    client = MlflowClient(tracking_uri=setup.tracker_uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "RUNNING"
    assert parent.data.params["space.x"] == "p" * PARAM_MAX_CHARS
    assert len(parent.data.tags["paiexp.long"]) == MAX_TAG_CHARS
    assert parent.data.tags["paiexp.sweep_id"] == "sweep-1"
    assert parent.data.metrics["best_score"] == 0.25
    assert parent.data.tags["paiexp.best_trial"] == "1"
    best = {n: client.get_run(worker.runs[f"job-{n}"]).data.tags["paiexp.best"] for n in (0, 1)}
    assert best == {0: "false", 1: "true"}

    # A relaunch finds the same parent (by the study's record, else by the sweep id; never a
    # trial's run, which carries the sweep id too) and reuses an adopted trial's run instead
    # of creating another.
    for known_run_id in (parent_id, worker.runs["job-0"], None):
        again = TrackingWorker(setup)
        again.apply(open_parent("sweep-1", known_run_id, leader=False))
        assert again.parent_run_id == parent_id
    adopted = again.apply(start_child("job-0", 0, adopted=True))
    assert adopted == RunCreated("job-0", worker.runs["job-0"])
    # Whether another launcher's trial runs is read as the call is applied, not as it was sent.
    other = optuna.load_study(study_name="syn", storage=create_storage(setup.storage))
    elsewhere = other.ask()
    elsewhere.set_user_attr(OWNER, "other-host:4242:1700000000:token")
    this_launcher = "this-host:77:1700000001:token"
    again.apply(FinishParent(interrupted=True, launcher=this_launcher))
    assert client.get_run(parent_id).info.status == "RUNNING"
    other.tell(elsewhere, 1.0)
    again.apply(FinishParent(interrupted=True, launcher=this_launcher))
    assert client.get_run(parent_id).info.status == "KILLED"
    assert len(client.search_runs([parent.info.experiment_id])) == 3


def test_launchers_sharing_a_study_share_its_parent_run_and_best_tag(tmp_path: Path) -> None:
    setup = setup_in(tmp_path)
    follower, leader = TrackingWorker(setup), TrackingWorker(setup)
    # The follower (it did not choose the sweep id) waits for the leader's parent run.
    waiting = threading.Thread(
        target=follower.apply, args=(open_parent("sweep-1", None, leader=False),)
    )
    waiting.start()
    assert_stays(waiting.is_alive, 1.0, "the follower waiting for its leader's parent run")
    leader.apply(open_parent("sweep-1", None))
    waiting.join(timeout=30)
    assert follower.parent_run_id == leader.parent_run_id
    client = MlflowClient(tracking_uri=setup.tracker_uri)
    experiment = client.get_run(leader.parent_run_id).info.experiment_id
    assert [r.info.run_id for r in client.search_runs([experiment])] == [leader.parent_run_id]

    # Each tags its view of the best, whoever made that run; an earlier view (fewer complete
    # trials) arriving late changes nothing.
    leader.apply(start_child("job-0", 0))
    follower.apply(start_child("job-1", 1))
    leader.apply(UpdateBest({"best_score": 0.5}, 1, {"paiexp.best_trial": "0"}, "job-0"))
    follower.apply(UpdateBest({"best_score": 0.25}, 2, {"paiexp.best_trial": "1"}, "job-1"))
    leader.apply(UpdateBest({"best_score": 0.5}, 1, {"paiexp.best_trial": "0"}, "job-0"))
    assert client.get_run(leader.parent_run_id).data.tags["paiexp.best_trial"] == "1"
    runs = {"job-0": leader.runs["job-0"], "job-1": follower.runs["job-1"]}

    def best() -> dict[str, str]:
        return {
            job: client.get_run(run).data.tags.get("paiexp.best", "") for job, run in runs.items()
        }

    assert best() == {"job-0": "false", "job-1": "true"}
    # The leader's view names a best whose run the follower has not made yet: the follower
    # tags it once made, with its next (earlier) view.
    leader.apply(UpdateBest({"best_score": 0.1}, 3, {"paiexp.best_trial": "2"}, "job-2"))
    assert best() == {"job-0": "false", "job-1": "true"}
    follower.apply(start_child("job-2", 2))
    runs["job-2"] = follower.runs["job-2"]
    follower.apply(UpdateBest({"best_score": 0.25}, 2, {"paiexp.best_trial": "1"}, "job-1"))
    assert best() == {"job-0": "false", "job-1": "false", "job-2": "true"}


def test_runs_created_for_one_identity_resolve_to_the_oldest(tmp_path: Path) -> None:
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "resolve")
    first = tracker.create_sweep_run("sweep-1", run_name="syn", tags={}, params={"a": "1"})
    second = tracker.create_sweep_run("sweep-1", run_name="syn", tags={}, params={"a": "1"})
    assert second == first == tracker.find_sweep_run("sweep-1")
    spec = JobSpec(name="job-0", command="python train.py")
    record = make_record({"backend": {"name": "local"}}, spec, project_dir=tmp_path, overrides=())
    made = [
        tracker.create_child_run(record, run_name="trial-0", parent_run_id=first, extra_tags={})
        for _ in range(2)
    ]
    children = [tracker.resolve_child(run_id, first, "job-0") for run_id in reversed(made)]
    assert children[0] == children[1]
    client = MlflowClient(tracking_uri=tracker.uri)
    runs = client.search_runs([tracker.experiment_id], run_view_type=ViewType.ALL)
    assert sorted(r.info.lifecycle_stage for r in runs) == [
        "active",
        "active",
        "deleted",
        "deleted",
    ]


def test_a_launcher_stalled_while_making_a_trials_run_keeps_the_adopters_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher that asked for a trial stamps its run's start, then stalls; meanwhile
    another launcher adopts the trial, finds no run, makes one and goes on with it.  The
    stalled run, older but come second, is deleted: one run for the trial, the adopter's."""
    setup = setup_in(tmp_path)
    asker, adopter = TrackingWorker(setup), TrackingWorker(setup)
    asker.apply(open_parent("sweep-1", None))
    adopter.apply(open_parent("sweep-1", None, leader=False))
    stamped = int(time.time() * 1000) - 1000  # the asker's start time, taken before its stall
    make_run = asker.tracker.create_child_run

    def stalled(*args: Any, **kwargs: Any) -> str:
        adopted = adopter.apply(start_child("job-0", 0, adopted=True))
        assert adopted is not None
        kept.append(adopted.run_id)
        monkeypatch.setattr(mlflow_service_client, "get_current_time_millis", lambda: stamped)
        return make_run(*args, **kwargs)

    kept: list[str] = []
    monkeypatch.setattr(asker.tracker, "create_child_run", stalled)
    shared = dataclasses.replace(start_child("job-0", 0), shared=True)
    assert asker.apply(shared) == RunCreated("job-0", kept[0])
    client = MlflowClient(tracking_uri=setup.tracker_uri)
    experiment = client.get_run(asker.parent_run_id).info.experiment_id
    runs = client.search_runs([experiment], "tags.`paiexp.trial_number` = '0'", ViewType.ALL)
    by_stage = {run.info.lifecycle_stage: run for run in runs}
    assert sorted(by_stage) == ["active", "deleted"]
    assert by_stage["active"].info.run_id == kept[0]
    assert by_stage["deleted"].info.start_time < by_stage["active"].info.start_time
    assert asker.runs["job-0"] == adopter.runs["job-0"] == kept[0]


def test_a_follower_whose_leader_never_made_the_parent_run_makes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking_worker, "PARENT_WAIT_SECONDS", 1.0)
    follower = TrackingWorker(setup_in(tmp_path))
    follower.apply(open_parent("sweep-1", None, leader=False))
    assert follower.tracker.find_sweep_run("sweep-1") == follower.parent_run_id
    assert follower.study.user_attrs[PARENT_RUN_ATTR] == follower.parent_run_id


@pytest.mark.slow
def test_a_follower_makes_the_parent_run_once_its_leader_falls_silent(tmp_path: Path) -> None:
    """A leader killed before its parent run: the follower waits while the leader heartbeats,
    and makes the run once it has been silent for the grace period (not after 120 s)."""
    setup = dataclasses.replace(setup_in(tmp_path), heartbeat_grace=2.0)
    study = optuna.load_study(study_name="syn", storage=create_storage(setup.storage))
    leader = "host-x:4242:None:abcd"  # another host's launcher: only its heartbeat tells
    study.set_user_attr(LEADER_ATTR, leader)
    storage, study_id = study_storage(study)
    silent = threading.Event()

    def heartbeat() -> None:
        while not silent.wait(0.1):
            storage.set_study_system_attr(study_id, HEARTBEAT + leader, time.time())

    beating = threading.Thread(target=heartbeat)
    beating.start()
    follower = TrackingWorker(setup)
    waiting = threading.Thread(
        target=follower.apply, args=(open_parent("sweep-1", None, leader=False),)
    )
    waiting.start()  # twice the grace: its leader's heartbeats keep it waiting
    assert_stays(waiting.is_alive, 2 * setup.heartbeat_grace, "the follower waiting")
    silent.set()
    fell_silent = time.monotonic()
    beating.join()
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    assert time.monotonic() - fell_silent < tracking_worker.PARENT_WAIT_SECONDS / 4
    assert follower.tracker.find_sweep_run("sweep-1") == follower.parent_run_id != ""
    assert study.user_attrs[PARENT_RUN_ATTR] == follower.parent_run_id


@pytest.mark.slow
def test_a_call_failing_before_the_parent_run_exists_is_fatal(tmp_path: Path) -> None:
    unusable = f"sqlite:///{tmp_path / 'missing-dir' / 'mlflow.db'}"
    tracker = SweepTracker(setup_in(tmp_path, tracker_uri=unusable))
    tracker.open_parent("sweep-1", None, {"study_name": "syn", "tags": {}, "params": {}}, {})
    tracker.fail_child("job-0", "never tracked")  # skipped: tracking stopped
    assert tracker.close() is None  # MLflow never opened
    assert tracker.fatal is not None and tracker.fatal.startswith("open_parent: ")
    assert tracker.errors == [tracker.fatal]
    assert tracker.run_ids == {}


def schema(path: Path) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]], bytes]:
    """A database's schema (each statement's lines sorted: MLflow's own builds differ in the
    order of a table's constraints), its alembic revision and its file header's journal
    bytes (1, 1: rollback journal, as MLflow leaves it)."""
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        revision = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    connection.close()
    statements = sorted(
        (kind, name, table, "\n".join(sorted((sql or "").splitlines())))
        for kind, name, table, sql in rows
    )
    return statements, revision, path.read_bytes()[18:20]


@pytest.mark.slow
def test_a_new_database_is_a_copy_of_mlflows_own_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking._tracking_service.utils import _get_store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert not template_path().exists()
    built = tmp_path / "built.db"
    create_sqlite_database(f"sqlite:///{built}")  # builds the cached template, then copies it
    mlflows = tmp_path / "mlflows.db"
    _get_store(f"sqlite:///{mlflows}").engine.dispose()  # MLflow's own build of a new file
    assert schema(template_path()) == schema(built) == schema(mlflows)
    assert schema(built)[2] == b"\x01\x01"
    assert not list(template_path().parent.glob(".*creating"))

    # A copy of the cached schema is what MLflow opens and writes without migrating.
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'copied.db'}", "fresh")
    run_id = tracker._create("r", {"paiexp.kind": "test"})
    tracker.terminate(run_id, "FINISHED")
    client = MlflowClient(tracking_uri=tracker.uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    default = client.get_experiment("0")
    assert default.artifact_location == str(tmp_path / "mlruns" / "0")
    assert schema(tmp_path / "copied.db") == schema(built)


@pytest.mark.slow
def test_the_launchers_plots_are_logged_unless_trials_ended_since_it_drew_them(
    tmp_path: Path,
) -> None:
    setup = setup_in(tmp_path)
    study = optuna.load_study(study_name="syn", storage=create_storage(setup.storage))
    for x in (1.0, 2.0):
        study.enqueue_trial({"x": x})
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 3)})
        study.tell(trial, x)
    drawn_by_launcher = tmp_path / "trials.csv"
    drawn_by_launcher.write_text("as the launcher drew it\n")
    client = MlflowClient(tracking_uri=setup.tracker_uri)

    def trials_table(finished: int) -> str:
        worker = TrackingWorker(setup)
        worker.apply(open_parent("sweep-1", None))
        drawn = Drawn((("study", drawn_by_launcher),), finished)
        worker.apply(FinishParent(interrupted=False, launcher="this-host:1:1:t", drawn=drawn))
        path = client.download_artifacts(worker.parent_run_id, "study/trials.csv", str(tmp_path))
        return Path(path).read_text()

    assert trials_table(2) == "as the launcher drew it\n"
    redrawn = trials_table(1)  # a trial ended after the launcher drew: drawn again here
    assert redrawn.splitlines()[0].startswith("number,value,") and len(redrawn.splitlines()) == 3


def finish_child(job_name: str, root: Path, *, nan: bool = False) -> FinishChild:
    """What a trial's job left: a metric series, a final metric, a model and a log."""
    model_dir = root / f"{job_name}-model"
    model_dir.mkdir()
    (model_dir / "model.json").write_text("{}")
    log = root / f"{job_name}.log"
    log.write_text("loss=0.5\nloss=0.25\n")
    series = [
        MetricPoint("loss", v, step, 1_700_000_000.0 + step) for step, v in enumerate([0.5, 0.25])
    ]
    if nan:
        series.append(MetricPoint("loss", float("nan"), 2, 1_700_000_002.0))
    result = JobResult(
        handle=JobHandle(job_name, job_name),
        status=JobStatus(JobState.SUCCEEDED),
        metrics={"loss": series[-1].value},
        series={"loss": series},
        output_parameters={"auc": 0.75},
        outputs={"model": model_dir.as_uri()},
        log_path=log,
    )
    return FinishChild(
        job_name, result, tuple(series), "FINISHED", None, {"paiexp.trial_state": "COMPLETE"}
    )


def run_content(client: MlflowClient, run_id: str, root: Path) -> dict[str, object]:
    """A run as a user reads it, its names and ids aside: params, tags, metric histories,
    artifacts (with their bytes), dataset inputs, and its logged model with its metrics."""
    run = client.get_run(run_id)
    job = run.data.tags["paiexp.job_name"]
    ids = {job: "JOB", run_id: "RUN", run.info.run_name: "NAME"}

    def same(text: str) -> str:
        for old, new in ids.items():
            text = text.replace(old, new)
        return text

    artifacts = {}
    pending = [""]
    while pending:
        for item in client.list_artifacts(run_id, pending.pop() or None):
            if item.is_dir:
                pending.append(item.path)
            else:
                local = Path(client.download_artifacts(run_id, item.path, str(root / "dl")))
                artifacts[same(item.path)] = same(local.read_text())
    (model,) = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
    )
    histories = {
        k: [(m.step, repr(m.value)) for m in client.get_metric_history(run_id, k)]
        for k in run.data.metrics
    }
    return {
        "status": run.info.status,
        "params": {k: same(v) for k, v in run.data.params.items()},
        "tags": {k: same(v) for k, v in run.data.tags.items() if k != "mlflow.runName"},
        "metrics": {k: repr(v) for k, v in run.data.metrics.items()},  # nan != nan
        "histories": {k: sorted(v, key=str) for k, v in histories.items()},
        "artifacts": artifacts,
        "datasets": [(d.dataset.name, d.dataset.source) for d in run.inputs.dataset_inputs],
        "outputs": [o.model_id == model.model_id for o in run.outputs.model_outputs],
        "model": (
            same(model.name),
            model.status.name,
            model.params,
            {k: same(v) for k, v in model.tags.items()},
            sorted((m.key, m.step, repr(m.value), m.run_id == run_id) for m in model.metrics or []),
        ),
    }


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "a-nan-point"])
def test_a_start_and_finish_joined_make_the_same_run_as_apart(tmp_path: Path, nan: bool) -> None:
    setup = setup_in(tmp_path)
    worker = TrackingWorker(setup)
    worker.apply(open_parent("sweep-1", None))
    data = tmp_path / "data.csv"
    data.write_text("x\n1\n")

    def start(job: str) -> StartChild:
        call = start_child(job, 7)
        return dataclasses.replace(
            call,
            record=TrialRecord(
                dataclasses.replace(call.record.spec, inputs={"train": str(data)}), call.record.data
            ),
        )

    worker.apply(start("two-calls"))
    worker.apply(finish_child("two-calls", tmp_path, nan=nan))
    finish = finish_child("one-call", tmp_path, nan=nan)
    joined = worker.apply(StartAndFinishChild(start("one-call"), finish))
    assert joined == RunCreated("one-call", worker.runs["one-call"])

    client = MlflowClient(tracking_uri=setup.tracker_uri)
    apart = run_content(client, worker.runs["two-calls"], tmp_path)
    assert apart["status"] == "FINISHED" and apart["outputs"] == [True]
    assert apart["datasets"] == [("train", data.as_uri())]
    assert {"config/resolved.yaml", "job/spec.json", "logs/JOB.log"} <= set(apart["artifacts"])
    assert run_content(client, worker.runs["one-call"], tmp_path) == apart


def losses(steps: range, read_at: float = 1_700_000_000.0) -> tuple[MetricPoint, ...]:
    """A trial's loss points of ``steps``, as the launcher read them at ``read_at``."""
    return tuple(MetricPoint("loss", 1.0 / (step + 1), step, read_at + step) for step in steps)


def loss_history(client: MlflowClient, run_id: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))


def test_points_sent_while_a_trial_runs_are_logged_once_however_often_they_come(
    tmp_path: Path,
) -> None:
    """A running trial's points, sent again whole (an outage's retry: no point is skipped
    by the launcher; a new tracking process sent the calls not done), and read again from
    its log's start at other times (an adopting launcher), are each logged once; its finish
    adds the rest."""
    setup = setup_in(tmp_path)
    worker = TrackingWorker(setup)
    worker.apply(open_parent("sweep-1", None))
    worker.apply(start_child("job-0", 0))
    run_id = worker.runs["job-0"]
    client = MlflowClient(tracking_uri=setup.tracker_uri)
    sent = LogPoints({"job-0": losses(range(3))})
    worker.apply(sent)
    assert loss_history(client, run_id) == [(s, 1.0 / (s + 1)) for s in range(3)]
    worker.apply(sent, retried=True)  # MLflow's store keeps an equal point once
    assert loss_history(client, run_id) == [(s, 1.0 / (s + 1)) for s in range(3)]

    again = TrackingWorker(setup)  # the tracking process died after logging, before Done
    again.resume(Resumed(worker.parent_run_id, dict(worker.runs)))
    again.apply(sent, retried=True)
    reread = LogPoints({"job-0": losses(range(5), read_at=1_700_000_100.0)})
    again.apply(reread)  # steps 0-2 held at other times: only 3 and 4 are new
    assert loss_history(client, run_id) == [(s, 1.0 / (s + 1)) for s in range(5)]
    finish = finish_child("job-0", tmp_path)
    rest = losses(range(5, 7))
    again.apply(dataclasses.replace(finish, unlogged=rest))
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert loss_history(client, run_id) == [(s, 1.0 / (s + 1)) for s in range(7)]


@pytest.mark.parametrize("live", [1, 2])
def test_a_run_given_points_while_its_job_ran_ends_as_one_given_them_at_its_end(
    tmp_path: Path, live: int
) -> None:
    """Its model, made as its job ends, is linked to each metric's last point, sent before
    (``live`` points of two) or with the finish."""
    setup = setup_in(tmp_path)
    worker = TrackingWorker(setup)
    worker.apply(open_parent("sweep-1", None))
    for job in ("at-end", "live"):
        worker.apply(start_child(job, 7))
    worker.apply(finish_child("at-end", tmp_path))
    finish = finish_child("live", tmp_path)
    worker.apply(LogPoints({"live": finish.unlogged[:live]}))
    worker.apply(dataclasses.replace(finish, unlogged=finish.unlogged[live:]))

    client = MlflowClient(tracking_uri=setup.tracker_uri)
    at_end = run_content(client, worker.runs["at-end"], tmp_path)
    assert ("loss", 1, "0.25", True) in at_end["model"][-1]  # type: ignore[index]
    assert run_content(client, worker.runs["live"], tmp_path) == at_end


def test_a_run_that_refuses_its_points_costs_the_other_trials_none_of_theirs(
    tmp_path: Path,
) -> None:
    setup = setup_in(tmp_path)
    worker = TrackingWorker(setup)
    worker.apply(open_parent("sweep-1", None))
    for number in range(2):
        worker.apply(start_child(f"job-{number}", number))
    worker.tracker.delete_run(worker.runs["job-0"])  # by hand, while its job runs
    with pytest.raises(MlflowException, match="must be in the 'active' state"):
        worker.apply(LogPoints({"job-0": losses(range(2)), "job-1": losses(range(2))}))
    client = MlflowClient(tracking_uri=setup.tracker_uri)
    assert loss_history(client, worker.runs["job-1"]) == [(0, 1.0), (1, 0.5)]


def test_the_queue_joins_a_trials_start_with_its_waiting_finish_only() -> None:
    calls: queue.Queue[object] = queue.Queue()
    root = Path("/nonexistent")
    result = JobResult(JobHandle("x", "x"), JobStatus(JobState.SUCCEEDED), {}, {})

    def finish(job: str) -> FinishChild:
        return FinishChild(
            job, dataclasses.replace(result, log_path=root), (), "FINISHED", None, {}
        )

    best = UpdateBest({"best": 1.0}, 1, {}, "a")
    adopted = start_child("c", 2, adopted=True)
    shared = dataclasses.replace(start_child("d", 3), shared=True)
    calls_sent = [
        start_child("a", 0),
        start_child("b", 1),
        finish("a"),
        best,
        adopted,
        finish("c"),
        shared,
        finish("d"),
    ]
    sent = [Sent(number, 1000.0 + number, call) for number, call in enumerate(calls_sent)]
    sent[2] = dataclasses.replace(sent[2], again=True)  # a's finish sent to a new process
    for message in sent:
        calls.put(message)
    queued = CallQueue(calls)
    taken = [queued.take() for _ in range(len(sent) - 1)]
    assert taken == [
        # a's finish waited: joined in a's start's place, stamped as the finish, sent again
        Sent(0, 1002.0, StartAndFinishChild(calls_sent[0], calls_sent[2]), True, joined=2),
        sent[1],  # b's has not come
        sent[3],
        sent[4],  # an adopted trial's run may exist: never joined
        sent[5],
        sent[6],  # another launcher may adopt it: never joined
        sent[7],
    ]
    assert taken[0].numbers == (0, 2) and sent[1].numbers == (1,)
    finish_b = Sent(8, 1008.0, finish("b"))
    calls.put(finish_b)
    calls.put(Close())
    assert [queued.take(), queued.take()] == [finish_b, Close()]


def test_a_trials_start_is_not_joined_with_its_finish_across_its_own_points() -> None:
    """Sent again to a new tracking process, a trial's start, its points and its finish all
    wait: its points go to its run before the finish closes it (another trial's points
    between its start and finish do not keep them apart)."""
    result = JobResult(JobHandle("x", "x"), JobStatus(JobState.SUCCEEDED), {}, {})
    calls_sent = [
        start_child("a", 0),
        LogPoints({"b": losses(range(1))}),
        FinishChild("a", result, (), "FINISHED", None, {}),
        start_child("c", 2),
        LogPoints({"c": losses(range(1))}),
        FinishChild("c", result, (), "FINISHED", None, {}),
    ]
    calls: queue.Queue[object] = queue.Queue()
    sent = [Sent(number, 1000.0 + number, call, True) for number, call in enumerate(calls_sent)]
    for message in sent:
        calls.put(message)
    queued = CallQueue(calls)
    assert [queued.take() for _ in range(len(sent) - 1)] == [
        Sent(0, 1002.0, StartAndFinishChild(calls_sent[0], calls_sent[2]), True, joined=2),
        *sent[1:2],
        *sent[3:],
    ]


@pytest.mark.slow
def test_a_sweeps_store_is_written_ahead_and_left_as_mlflow_leaves_it(tmp_path: Path) -> None:
    """The tracking process writes through a write-ahead log synced at checkpoints only: a
    writer killed at once (no checkpoint, no close) loses no commit; as the sweep ends the
    store returns to its rollback journal, the log moved into the file."""
    store = tmp_path / "mlflow.db"
    uri = f"sqlite:///{store}"
    create_sqlite_database(uri)
    writer = f"""
import os, signal
from sqlalchemy import create_engine
from paiexp.tracking.sqlite_store import write_ahead
from paiexp.tracking.mlflow_tracker import MlflowTracker
write_ahead({uri!r})
tracker = MlflowTracker({uri!r}, "killed")
for name in ("a", "b", "c"):
    tracker.terminate(tracker._create(name, {{"paiexp.kind": "test"}}), "FINISHED")
with create_engine({uri!r}).connect() as connection:
    pragmas = ("journal_mode", "synchronous")
    print([connection.exec_driver_sql(f"PRAGMA {{p}}").scalar() for p in pragmas], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run(
        [sys.executable, "-c", writer], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.strip() == "['wal', 1]"  # synchronous=NORMAL
    assert (tmp_path / "mlflow.db-wal").stat().st_size > 0  # the commits, never checkpointed

    def finished() -> list[str]:
        client = MlflowClient(tracking_uri=uri)
        (experiment,) = [e for e in client.search_experiments() if e.name == "killed"]
        runs = client.search_runs([experiment.experiment_id])
        return sorted(r.info.run_name for r in runs if r.info.status == "FINISHED")

    assert finished() == ["a", "b", "c"]
    leave_write_ahead(uri)
    assert store.read_bytes()[18:20] == b"\x01\x01"  # the rollback journal, as MLflow's
    assert not (tmp_path / "mlflow.db-wal").exists()
    alone = tmp_path / "alone" / "mlflow.db"
    alone.parent.mkdir()
    alone.write_bytes(store.read_bytes())  # the file by itself holds every run
    uri = f"sqlite:///{alone}"
    assert finished() == ["a", "b", "c"]
    assert not list(alone.parent.glob("mlflow.db-*"))  # it needed no log: it was whole


@pytest.mark.slow
def test_a_store_another_process_is_reading_keeps_its_rollback_journal(tmp_path: Path) -> None:
    """Where the log cannot be made at once (here: another process's open read), the store
    stays as it is, and the tracker works on in it."""
    store = tmp_path / "mlflow.db"
    uri = f"sqlite:///{store}"
    create_sqlite_database(uri)
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sqlite3, sys; c = sqlite3.connect({str(store)!r}, isolation_level=None); "
            "c.execute('BEGIN'); c.execute('SELECT * FROM experiments').fetchall(); "
            "print('reading', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "reading\n"
        write_ahead(uri)
        reading = MlflowTracker(uri, None)  # opens the store: reads only, beside the reader
        assert reading._client.get_experiment("0").name == "Default"
        with sqlite3.connect(store) as connection:
            assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        connection.close()
    finally:
        reader.communicate("", timeout=30)
    tracker = MlflowTracker(uri, "after the reader")  # writes, once the reader is done
    tracker.terminate(tracker._create("r", {"paiexp.kind": "test"}), "FINISHED")
    (run,) = MlflowClient(tracking_uri=uri).search_runs([tracker.experiment_id])
    assert run.info.status == "FINISHED"
