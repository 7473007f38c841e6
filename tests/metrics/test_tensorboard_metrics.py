"""TensorBoard scalars as metrics: the event files a job writes to its tensorboard channel
become its run's metric series, its sweep's objective and pruning signal, on every backend.

The reader is checked against TensorBoard's other reader (its event multiplexer, which loads
whole directories), the runs against the event files the jobs left.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_backends import CliBackend
from conftest import all_runs, clean_env, run_paiexp, wait_until
from gates import Gates
from pipeline_helpers import starter_project, statuses, write_pipeline
from sweep_helpers import (
    children_by_trial,
    load_study,
    sweep_third_trial_pruned,
    synthetic_project,
)
from test_live_curves import backend_for

from paiexp.metrics.tensorboard import (
    ScalarReader,
    TensorBoardMetric,
    TensorBoardScalars,
)
from paiexp.tracking.cost import COST, INSTANCE_HOURS

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

# The synthetic job with hyperparameter tensorboard=true prints no metric: it writes `loss` and
# `accuracy` per step to the channel's train/ directory, and `score` to the channel itself.
COST_METRICS = (INSTANCE_HOURS, COST)  # paiexp's own metrics of every run
TENSORBOARD_JOB = {
    "metric_definitions": [],
    "tensorboard": {"metrics": ["score", {"name": "loss", "tag": "train/loss"}]},
}


def written_scalars(channel: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``channel`` by tag path, as TensorBoard's event multiplexer reads it."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    multiplexer = EventMultiplexer().AddRunsFromDirectory(str(channel))
    multiplexer.Reload()
    scalars = {}
    for run, tags in multiplexer.Runs().items():
        for tag in tags["scalars"]:
            path = tag if run == "." else f"{run}/{tag}"
            scalars[path] = [(e.step, e.value) for e in multiplexer.Scalars(run, tag)]
    return scalars


def write_scalars(directory: Path, scalars: list[tuple[str, int, float]]) -> Path:
    """An event file of ``(tag, step, value)`` scalars in ``directory``, as PyTorch's
    SummaryWriter writes them (``simple_value``), written whole; returns it."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory))
    for tag, step, value in scalars:
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]
        )
        writer.add_event(event_pb2.Event(step=step, wall_time=1000.0 + step, summary=summary))
    writer.close()
    (path,) = directory.glob("events.out.tfevents.*")
    return path


# -- the reader --------------------------------------------------------------------------------


def test_scalars_are_read_as_the_files_grow_each_point_once(tmp_path: Path) -> None:
    """A file written in two parts, the first ending inside a record: the reader waits for
    that record's end, then reads on from it; a new file is read from its start."""
    whole = write_scalars(
        tmp_path / "whole", [("loss", step, 1.0 / (step + 1)) for step in range(5)]
    )
    data = whole.read_bytes()
    channel = tmp_path / "tensorboard"
    (channel / "train").mkdir(parents=True)
    growing = channel / "train" / whole.name
    growing.write_bytes(data[: len(data) * 2 // 3])
    reader = ScalarReader(TensorBoardScalars())
    first = reader.read(channel)
    assert first and all(p.name == "train/loss" for p in first)
    assert reader.read(channel) == []  # nothing new: the cut record is not taken
    with growing.open("ab") as stream:
        stream.write(data[len(data) * 2 // 3 :])
    write_scalars(channel / "validation", [("loss", 4, 0.9)])
    second = reader.read(channel)
    assert [(p.name, p.step) for p in first + second] == [
        *(("train/loss", step) for step in range(5)),
        ("validation/loss", 4),
    ]
    assert reader.read(channel) == []
    read = {name: [(p.step, p.value) for p in points] for name, points in reader.series.items()}
    assert read == written_scalars(channel)
    assert {p.timestamp for p in first + second} == {1000.0 + step for step in range(5)}
    assert reader.final() == {
        "train/loss": pytest.approx(0.2),
        "validation/loss": pytest.approx(0.9),
    }
    assert reader.unreadable() == []


def test_tf2_tensor_scalars_are_read_like_simple_values(tmp_path: Path) -> None:
    """TF2's ``tf.summary.scalar`` writes a tensor and names the scalars plugin in a tag's
    first value only: every later value of that tag is a scalar too."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    writer = EventFileWriter(str(tmp_path))
    for step in range(3):
        value = summary_pb2.Summary.Value(
            tag="epoch_loss", tensor=tensor_util.make_tensor_proto(2.0 - step)
        )
        if step == 0:
            value.metadata.plugin_data.plugin_name = "scalars"
        summary = summary_pb2.Summary(value=[value])
        writer.add_event(event_pb2.Event(step=step, wall_time=1000.0 + step, summary=summary))
    other = summary_pb2.Summary.Value(tag="weights", tensor=tensor_util.make_tensor_proto([1.0]))
    writer.add_event(event_pb2.Event(step=0, summary=summary_pb2.Summary(value=[other])))
    writer.close()
    reader = ScalarReader(TensorBoardScalars())
    points = reader.read(tmp_path)
    assert [(p.name, p.step, p.value, p.timestamp) for p in points] == [
        ("epoch_loss", step, 2.0 - step, 1000.0 + step) for step in range(3)
    ]
    assert reader.tags == {"epoch_loss"}  # the tensor of no scalar plugin is no scalar


def test_declared_scalars_take_their_names_and_others_their_tag_paths(tmp_path: Path) -> None:
    write_scalars(
        tmp_path / "validation", [("epoch_loss", 0, 0.5), ("lr (sched)", 0, 0.25), ("loss", 0, 0.7)]
    )
    declared = TensorBoardMetric("val_loss", "validation/epoch_loss")
    every = ScalarReader(TensorBoardScalars((declared,)), taken={"validation/loss"})
    every.read(tmp_path)
    # renamed; a name MLflow would refuse made one; a log metric's name not fed twice
    assert every.final() == {"val_loss": 0.5, "validation/lr _sched_": 0.25}
    only = ScalarReader(TensorBoardScalars((declared,), other_scalars=False))
    only.read(tmp_path)
    assert only.final() == {"val_loss": 0.5}
    assert only.tags == {"validation/epoch_loss", "validation/lr (sched)", "validation/loss"}


def test_a_declared_tag_never_written_names_the_tags_that_were(tmp_path: Path) -> None:
    write_scalars(tmp_path, [("loss", 0, 0.5)])
    reader = ScalarReader(TensorBoardScalars((TensorBoardMetric("acc", "accuracy"),)))
    reader.read(tmp_path)
    assert reader.missing() == {
        "acc": "no scalar with tag 'accuracy' was written to the tensorboard channel; "
        "the job wrote tags: loss"
    }
    assert ScalarReader(TensorBoardScalars((TensorBoardMetric("acc", "accuracy"),))).missing() == {
        "acc": "no scalar with tag 'accuracy' was written to the tensorboard channel; "
        "it holds no scalar"
    }


def test_a_truncated_or_corrupt_event_file_is_one_line_and_its_points_are_kept(
    tmp_path: Path,
) -> None:
    for name in ("cut", "bent"):
        write_scalars(tmp_path / name, [("loss", step, float(step)) for step in range(4)])
    (cut,) = (tmp_path / "cut").iterdir()
    cut.write_bytes(cut.read_bytes()[:-5])  # the last record's end lost
    (bent,) = (tmp_path / "bent").iterdir()
    data = bytearray(bent.read_bytes())
    data[-3] ^= 0xFF  # the last record's checksum no longer matches
    bent.write_bytes(bytes(data))
    reader = ScalarReader(TensorBoardScalars())
    reader.read(tmp_path)
    reader.read(tmp_path)  # tried again: a writer may have finished the record since
    assert {name: [p.step for p in points] for name, points in reader.series.items()} == {
        "bent/loss": [0, 1, 2],
        "cut/loss": [0, 1, 2],
    }
    lines = reader.unreadable()
    assert len(lines) == 2
    for line, name in zip(sorted(lines), ("bent", "cut"), strict=True):
        assert line.startswith(f"TensorBoard event file {name}/events.out.tfevents."), line
        assert "truncated or corrupt from byte" in line
        assert line.endswith("the 3 points before it are kept")


# -- sweeps and runs ---------------------------------------------------------------------------


@contextlib.contextmanager
def pruning_backend(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Gates, list[str], dict[str, str], Callable[[str], Path]]]:
    """A backend as ``backend_for`` gives it, and its runs' tensorboard channels as directories
    here (the PAI emulator's copied from its OSS)."""
    if name == "pai":
        from emulator import Emulator
        from test_pai_backend import pai_env, pai_overrides

        with Emulator(tmp_path / "cloud") as cloud:  # its jobs as host processes: gates here

            def fetched(uri: str) -> Path:
                channel = tmp_path / "channels" / uri.rstrip("/").split("/")[-2]
                cloud.store.download_uri(uri, channel)
                return channel

            yield Gates(tmp_path / "gates"), pai_overrides(cloud), pai_env(cloud), fetched
    else:
        with backend_for(name, tmp_path, request) as (gates, overrides, env):
            yield gates, overrides, env, lambda uri: Path(uri.removeprefix("file://"))


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("local"),
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("pai", marks=pytest.mark.slow),
        pytest.param("openpai", marks=pytest.mark.docker),
    ],
)
def test_a_sweep_is_judged_and_pruned_on_tensorboard_scalars(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Objective `score` and the median pruner's `loss` come from event files only; the third
    trial (far worse) is pruned while held, and every run's series equals its event files."""
    with pruning_backend(backend, tmp_path, request) as (gates, overrides, env, channel_of):
        sweep_third_trial_pruned(
            tmp_path,
            gates,
            overrides,
            env,
            TENSORBOARD_JOB,
            duration=0.1,
            steps=5,
            tensorboard=True,
        )
        for number, child in children_by_trial(tmp_path).items():
            channel = channel_of(child.data.tags["paiexp.output.tensorboard"])
            assert_series_equal_event_files(tmp_path, child.info.run_id, channel, number != "2")


def assert_series_equal_event_files(root: Path, run_id: str, channel: Path, ended: bool) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    written = written_scalars(channel)
    expected = {"loss": written["train/loss"], "train/accuracy": written["train/accuracy"]}
    if ended:
        expected["score"] = written["score"]
    logged = {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
        for name in client.get_run(run_id).data.metrics
        if name not in COST_METRICS
    }
    assert logged == {name: sorted(points) for name, points in expected.items()}


def test_tensorboard_metrics_on_every_backend(
    tmp_path: Path, cli_backend: CliBackend, request: pytest.FixtureRequest
) -> None:
    """Two trials on each backend: their objective is the `score` their event files hold, and
    each run's series are the files' points (PAI's channel read from OSS)."""
    sweep = {
        "params": {"x": "choice(0.5, 1.5)", "duration": 0.1, "steps": 3, "tensorboard": True},
        "n_trials": 2,
        "sampler": {"name": "bruteforce"},
    }
    root = synthetic_project(tmp_path, sweep, TENSORBOARD_JOB)
    done = run_paiexp(root, "+sweep=syn", "-q", *cli_backend.overrides, env=cli_backend.env)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    study = load_study(root)
    assert sorted(t.value for t in study.trials) == [0.25, 2.25]
    for child in children_by_trial(root).values():
        uri = child.data.tags["paiexp.output.tensorboard"]
        channel = tmp_path / "channel" / child.info.run_id
        if uri.startswith("oss://"):
            request.getfixturevalue("pai_cloud").store.download_uri(uri, channel)
        else:
            channel = Path(uri.removeprefix("file://"))
        assert_series_equal_event_files(root, child.info.run_id, channel, ended=True)
        assert math.isfinite(child.data.metrics["score"])
    shown = run_paiexp(root, "tensorboard", "syn", "--print", env=cli_backend.env)
    assert shown.returncode == 0, shown.stderr
    spec = shlex.split(shown.stdout)[shlex.split(shown.stdout).index("--logdir_spec") + 1]
    logdirs = dict(item.split(":", 1) for item in spec.split(","))
    assert sorted(logdirs) == ["trial-0", "trial-1"]
    for directory in logdirs.values():  # on PAI: copies of the channels on OSS
        assert sorted(written_scalars(Path(directory))) == ["score", "train/accuracy", "train/loss"]


def test_a_single_run_warns_of_a_declared_tag_never_written(tmp_path: Path) -> None:
    job = {
        **TENSORBOARD_JOB,
        "hyperparameters": {"x": 0.5, "steps": 3, "tensorboard": True, "model": True},
        "tensorboard": {"metrics": [*TENSORBOARD_JOB["tensorboard"]["metrics"], "val/loss"]},
    }
    root = synthetic_project(tmp_path, {}, job)
    done = run_paiexp(root, "-q")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].endswith(
        "TensorBoard metric 'val/loss': no scalar with tag 'val/loss' was written to the "
        "tensorboard channel; the job wrote tags: score, train/accuracy, train/loss"
    ), warnings
    (run,) = all_runs(root)
    assert run.data.metrics["score"] == 0.25
    assert run.data.metrics["loss"] == pytest.approx(0.25 + 1 / 3)


def test_a_pipeline_condition_reads_a_tensorboard_metric(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {}, TENSORBOARD_JOB)
    hps = {"x": 0.5, "duration": 0.1, "steps": 3, "tensorboard": True}
    step = {"overrides": {"job": {"hyperparameters": hps}}}
    write_pipeline(
        root,
        "judged",
        {
            "train": step,
            "kept": {**step, "depends": ["train"], "when": 'steps.train.metrics["score"] < 1'},
            "dropped": {**step, "depends": ["train"], "when": 'steps.train.metrics["loss"] > 9'},
        },
    )
    done = run_paiexp(root, "+pipeline=judged", "-q")
    assert done.returncode == 0, done.stderr
    assert statuses(root, "judged") == {
        "train": "succeeded",
        "kept": "succeeded",
        "dropped": "skipped",
    }


@pytest.mark.parametrize("backend", ["local", "pai"])
def test_a_running_jobs_scalars_reach_its_run_while_it_runs(tmp_path: Path, backend: str) -> None:
    """The job writes its steps' scalars, then is held at its gate: its run holds them all
    while it is still held (on PAI: written through the channel's mount to OSS, read there)."""
    from mlflow.tracking import MlflowClient

    steps = 4
    gates = Gates(tmp_path / "gates")
    hps = {"x": 0.5, "duration": 0.1, "steps": steps, "tensorboard": True, "model": True}
    job = {**TENSORBOARD_JOB, "hyperparameters": hps, "environments": gates.env()}
    root = synthetic_project(tmp_path / "project", {}, job)
    with contextlib.ExitStack() as stack:
        args, env = [], clean_env(**gates.env())
        if backend == "pai":
            from emulator import Emulator
            from test_pai_backend import pai_env, pai_overrides

            cloud = stack.enter_context(Emulator(tmp_path / "cloud"))  # jobs on the host
            args, env = pai_overrides(cloud), pai_env(cloud)
        launcher = subprocess.Popen(
            [sys.executable, "-m", "paiexp", *args],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        stack.callback(lambda: launcher.poll() is None and launcher.kill())
        (held,) = gates.wait_held(1)
        client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")

        def streamed() -> list[Any]:
            runs = client.search_runs([r.experiment_id for r in client.search_experiments()])
            return runs and client.get_metric_history(runs[0].info.run_id, "loss")

        history = wait_until(lambda: len(streamed()) == steps and streamed(), 60, "4 points")
        assert gates.held() == [held] and launcher.poll() is None  # it runs still
        assert sorted((m.step, m.value) for m in history) == [
            (step, pytest.approx(0.25 + 1 / (step + 1))) for step in range(steps)
        ]
        gates.open([held])
        _, err = launcher.communicate(timeout=120)
        assert launcher.returncode == 0, err
    (run,) = all_runs(root)
    assert len(client.get_metric_history(run.info.run_id, "loss")) == steps  # each once
    assert run.data.metrics["score"] == 0.25


def test_the_starter_sgd_sweep_runs_on_its_tensorboard_scalars(tmp_path: Path) -> None:
    """The starter project's SGD job prints no metric: its sweep is judged on the scalars it
    writes."""
    root = starter_project(tmp_path)
    done = run_paiexp(root, "job=sgd", "+sweep=sgd", "sweep.n_trials=3", "-q")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
    study = load_study(root, "sgd")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    for child in children_by_trial(root).values():
        metrics = child.data.metrics
        assert {"val_loss", "val_accuracy", "train/loss"} <= set(metrics)
        assert 0.5 < metrics["val_accuracy"] <= 1.0


def test_tensorboard_serves_each_trial_of_a_sweep_as_a_run(tmp_path: Path) -> None:
    root = starter_project(tmp_path)
    done = run_paiexp(root, "job=sgd", "+sweep=sgd", "sweep.n_trials=2", "-q")
    assert done.returncode == 0, done.stderr
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "tensorboard", "sgd", "--port", str(port)],
        cwd=root,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def answer(path: str) -> Any:
            try:
                with urllib.request.urlopen(f"http://localhost:{port}{path}", timeout=5) as reply:
                    return json.load(reply)
            except OSError:
                assert server.poll() is None, server.communicate()[0]
                return None

        runs = wait_until(lambda: answer("/data/runs"), 120, "TensorBoard to answer")
        assert sorted(runs) == [
            "trial-0/train",
            "trial-0/validation",
            "trial-1/train",
            "trial-1/validation",
        ]
        tags = answer("/data/plugin/scalars/tags")
        assert set(tags["trial-1/validation"]) == {"loss", "accuracy"}
    finally:
        server.terminate()
        server.communicate(timeout=60)
