"""The MLflow tracking server goes away in the middle of a sweep, and comes back.

The sweep's trials keep running and finishing meanwhile (jobs held at their gates,
tests/gates.py, until the server is down: two waves of trials end in the outage by
construction); the tracking process waits for the server with its calls queued in order,
then writes them: every trial ends with one FINISHED
run holding all its metric points once, and one logged model.  The server is the real
``mlflow server`` of tests/servers.py (PostgreSQL behind it), stopped and started again on
its port.  An outage longer than ``tracker.outage_timeout`` stops the sweep submitting; the
next launch writes the runs that are missing, each point once, whatever part of them the
server had taken before it went away (a proxy stops answering at that exact call).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, wait_until
from gates import Gates, cleaned_up
from servers import MlflowServer
from sweep_helpers import load_study, synthetic_project
from tracking_proxy import Cut, tracking_proxy, trial_points

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

N_TRIALS = 6  # three waves of two: one before the outage, two in it
STEPS = 4
SWEEP = {  # each job is held at its gate once its steps are printed, until the test opens it
    "params": {"x": "interval(-3, 3)", "duration": 0.2, "steps": STEPS, "model": "true"},
    "n_trials": N_TRIALS,
    "parallelism": 2,
    "sampler": {"name": "random", "seed": 3},
}


def launch(
    root: Path, uri: str, experiment: str, *overrides: str, gates: Gates | None = None
) -> subprocess.Popen[bytes]:
    """The sweep's launcher, its output in launcher.log (appended); its jobs held at
    ``gates``, if given."""
    with open(root / "launcher.log", "a") as log:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "paiexp", "+sweep=syn"),
                *(f"tracker.uri={uri}", f"tracker.experiment={experiment}", *overrides),
            ],
            cwd=root,
            env=clean_env(LEDGER=str(root / "ledger.txt"), **(gates.env() if gates else {})),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def a_run_finished(client: Any, experiment: str) -> bool:
    _, children = trial_runs(client, experiment)
    return any(c.info.status == "FINISHED" for c in children)


def assert_one_finished_run_per_trial(
    client: Any, experiment: str, root: Path, n_trials: int = N_TRIALS
) -> None:
    """Every trial COMPLETE, its job run once; one parent run holding each step of its
    metrics once, and per trial one FINISHED run holding each metric point once and one
    logged model."""
    trials = load_study(root).get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["COMPLETE"] * n_trials
    ledger = (root / "ledger.txt").read_text().splitlines()
    executions = Counter(float(json.loads(line)["x"]) for line in ledger)
    assert executions == Counter(t.params["x"] for t in trials), "a job ran twice, or never"

    parents, children = trial_runs(client, experiment)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", parents
    for name in parents[0].data.metrics:
        steps = [m.step for m in client.get_metric_history(parents[0].info.run_id, name)]
        assert len(steps) == len(set(steps)), f"the sweep's {name}: a step twice, {steps}"
    numbers = sorted(int(c.data.tags["paiexp.trial_number"]) for c in children)
    assert numbers == list(range(n_trials)), "a trial has no run, or two"
    experiment_id = parents[0].info.experiment_id
    models = client.search_logged_models([experiment_id], max_results=1000)
    for child in children:
        run_id = child.info.run_id
        assert child.info.status == "FINISHED", child.data.tags.get("paiexp.failure_reason")
        steps = [m.step for m in client.get_metric_history(run_id, "loss")]
        assert sorted(steps) == list(range(STEPS)), f"each point once: {steps}"
        assert len(client.get_metric_history(run_id, "score")) == 1, "a point twice"
        made = [m for m in models if m.source_run_id == run_id]
        assert [m.status.name for m in made] == ["READY"], "a model twice, or none"
        outputs = client.get_run(run_id).outputs
        assert [o.model_id for o in outputs.model_outputs] == [made[0].model_id]
    assert len(models) == n_trials


def trial_runs(client: Any, experiment: str) -> tuple[list[Any], list[Any]]:
    """(parent runs, child runs) of ``experiment`` on the server."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return [], []
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("paiexp.kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def log(root: Path) -> str:
    """What the sweep's launchers printed."""
    return (root / "launcher.log").read_text()


def complete_trials(root: Path) -> int:
    from optuna.trial import TrialState

    return len(load_study(root).get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def test_a_tracking_server_down_mid_sweep_loses_and_duplicates_nothing(
    tmp_path: Path, tracking_server: MlflowServer
) -> None:
    from mlflow.tracking import MlflowClient

    root = synthetic_project(tmp_path, SWEEP)
    client = MlflowClient(tracking_uri=tracking_server.uri)
    gates = Gates(tmp_path / "gates")
    launcher = launch(root, tracking_server.uri, "outage", gates=gates)
    try:
        gates.open(gates.wait_held(2))
        wait_until(lambda: a_run_finished(client, "outage"), 120, "a trial's run to finish")
        in_flight = gates.wait_held(2)
        tracking_server.stop()
        try:
            gates.open(in_flight)  # they end in the outage, and the sweep submits more
            gates.open(gates.wait_held(2))
            wait_until(lambda: complete_trials(root) == N_TRIALS, 120, "every trial to complete")
            wait_until(lambda: "is not answering" in log(root), 120, "tracking to find it gone")
            assert launcher.poll() is None, "the sweep ended while the server was down"
        finally:
            tracking_server.start()
        assert launcher.wait(timeout=240) == 0, log(root)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()

    output = log(root)
    assert "is not answering" in output and "is back after" in output, output
    assert "MLflow calls failed" not in output, output
    assert_one_finished_run_per_trial(client, "outage", root)


def test_past_tracker_outage_timeout_it_stops_submitting_and_the_next_launch_writes_the_rest(
    tmp_path: Path, tracking_server: MlflowServer
) -> None:
    from mlflow.tracking import MlflowClient

    root = synthetic_project(tmp_path, SWEEP)
    client = MlflowClient(tracking_uri=tracking_server.uri)
    gates = Gates(tmp_path / "gates")
    launcher = launch(root, tracking_server.uri, "gave-up", "tracker.outage_timeout=3", gates=gates)
    try:
        gates.open(gates.wait_held(2))
        wait_until(lambda: a_run_finished(client, "gave-up"), 120, "a trial's run to finish")
        in_flight = gates.wait_held(2)
        tracking_server.stop()
        try:
            # Said at once, its slots still taken: the jobs in flight were held through it.
            gave_up = "no new trials: MLflow tracking failed"
            wait_until(lambda: gave_up in log(root), 120, "the launcher to give tracking up")
            gates.open(in_flight)
            code = launcher.wait(timeout=120)
        finally:
            tracking_server.start()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = log(root)
    assert code == 1, output
    assert "stopped submitting: MLflow tracking failed" in output, output
    assert "tracker.outage_timeout: the MLflow tracking server at" in output, output
    ran = load_study(root).get_trials(deepcopy=False)
    assert [t.state.name for t in ran] == ["COMPLETE"] * 4  # no trial after it gave up

    again = launch(root, tracking_server.uri, "gave-up")
    assert again.wait(timeout=240) == 0, log(root)
    assert_one_finished_run_per_trial(client, "gave-up", root)


@pytest.mark.parametrize("keep", [2, None], ids=["some-points-written", "all-points-written"])
def test_a_relaunch_after_the_server_went_away_mid_write_logs_each_point_once(
    tmp_path: Path, tracking_server: MlflowServer, keep: int | None
) -> None:
    """The server stops answering exactly as a trial's points reach it (``keep`` of them, or
    all), the launcher gives up past its outage timeout, and the next launch completes the
    trial's run: each point once, one model, the sweep's own series once a step."""
    from mlflow.tracking import MlflowClient

    n_trials = 3
    root = synthetic_project(tmp_path, {**SWEEP, "n_trials": n_trials, "parallelism": 1})
    experiment = f"cut-after-{keep or 'all'}"
    gates = Gates(tmp_path / "gates")
    with tracking_proxy(tracking_server.uri) as proxy:
        proxy.cut_at(Cut(trial_points, keep=keep))
        first = launch(root, proxy.uri, experiment, "tracker.outage_timeout=2", gates=gates)
        with cleaned_up(gates, [first]):
            # a trial's points are logged once its job ended: the first trial's cut the server
            gates.open(gates.wait_held(1))
            wait_until(proxy.down.is_set, 120, "the server to go away")
            gave_up = "no new trials: MLflow tracking failed"
            wait_until(lambda: gave_up in log(root), 120, "the launcher to give tracking up")
            # every other job was held through it: the last trial never started
            assert complete_trials(root) == 1 and len(load_study(root).trials) < n_trials
            gates.open(gates.held())
            code = first.wait(timeout=120)
        output = log(root)
        assert code == 1, output
        assert "the next launch of this sweep re-applies what is missing" in output, output
        proxy.restore()
        again = launch(root, proxy.uri, experiment)
        assert again.wait(timeout=240) == 0, log(root)
    client = MlflowClient(tracking_uri=tracking_server.uri)
    assert_one_finished_run_per_trial(client, experiment, root, n_trials)
