"""Launchers on several hosts share one study in PostgreSQL and one MLflow tracking server.

Each launcher is a process of its own with a host identity of its own
(``PAIEXP_LAUNCHER_HOST``), all in one project directory (backend=local: each finds the jobs
of the others by name).  The study is in a real PostgreSQL cluster, the runs on a real
``mlflow server`` backed by it (tests/servers.py).  The synthetic job appends its
hyperparameters to a ledger each time it runs, and is held at its gate (tests/gates.py) until
the test lets it end: what must happen while trials run (every host running one, a launcher
killed or stopped with trials in flight) happens by construction.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, wait_until
from gates import Gates
from servers import Postgres
from sweep_helpers import counted_trials, synthetic_project

from paiexp.sweep.records import JOB_ID, OWNER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOSTS = ("host-a", "host-b", "host-c")
N_TRIALS = 12
GRACE = 4.0  # sweep.heartbeat_grace: a heartbeat every second


@dataclass
class SharedSweep:
    """One study on PostgreSQL, tracked on the MLflow server, run by launchers per host."""

    root: Path
    storage: str
    tracking_uri: str
    experiment: str
    gates: Gates
    launchers: dict[str, subprocess.Popen[str]]

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.txt"

    def start(self) -> None:
        for host in HOSTS:
            log = open(self.root / f"{host}.log", "w")  # noqa: SIM115 (the process keeps it)
            with log:
                self.launchers[host] = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "paiexp", "+sweep=syn"),
                        f"tracker.uri={self.tracking_uri}",
                        f"tracker.experiment={self.experiment}",
                    ],
                    cwd=self.root,
                    env=clean_env(
                        LEDGER=str(self.ledger), PAIEXP_LAUNCHER_HOST=host, **self.gates.env()
                    ),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                )

    def said(self, host: str) -> str:
        return (self.root / f"{host}.log").read_text()

    def wait(self, *hosts: str) -> None:
        """The launchers of ``hosts`` end, each with exit code 0."""
        for host in hosts:
            code = self.launchers[host].wait(timeout=240)
            assert code == 0, f"{host} exited with {code}:\n{self.said(host)}"

    def study(self) -> Any:
        import optuna

        return optuna.load_study(study_name="syn", storage=self.storage)

    def running_of(self, host: str) -> list[Any]:
        """The RUNNING trials whose job ``host``'s launcher submitted and follows."""
        from optuna.trial import TrialState

        try:
            trials = self.study().get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        except KeyError:  # no study yet
            return []
        return [t for t in trials if host_of(t) == host and JOB_ID in t.user_attrs]

    def held_running(self, host: str) -> set[int]:
        """The numbers of ``host``'s trials in flight, none of the sweep's jobs let end yet:
        each of them is running (held at its gate)."""
        assert not self.gates.opened(), "a job was let end"
        return {t.number for t in self.running_of(host)}

    def adopted(self, numbers: set[int]) -> bool:
        """Whether the trials ``numbers`` all belong to host-b or host-c now."""
        trials = self.study().get_trials(deepcopy=False)
        return all(host_of(trials[n]) in ("host-b", "host-c") for n in numbers)

    def assert_exact(self) -> list[Any]:
        """Exactly N_TRIALS trials that count, each COMPLETE, each job run once; one parent
        run, one FINISHED child run per trial.  Returns those trials."""
        trials = counted_trials(self.study().get_trials(deepcopy=False))
        assert [t.state.name for t in trials] == ["COMPLETE"] * N_TRIALS
        executions = self.ledger.read_text().splitlines()
        ran = Counter(float(json.loads(line)["x"]) for line in executions)
        assert ran == Counter(t.params["x"] for t in trials), "a job ran twice, or never"
        parents, children = self.runs()
        assert len(parents) == 1, [p.info.run_id for p in parents]
        assert parents[0].info.status == "FINISHED"
        assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
        numbers = sorted(int(c.data.tags["paiexp.trial_number"]) for c in children)
        assert numbers == [t.number for t in trials], "a trial has no run, or two"
        assert {c.info.status for c in children} == {"FINISHED"}
        assert all("score" in c.data.metrics for c in children)
        return trials

    def runs(self) -> tuple[list[Any], list[Any]]:
        """(parent runs, child runs) of the experiment on the tracking server."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = client.get_experiment_by_name(self.experiment)
        assert experiment is not None, f"no experiment {self.experiment} on the server"
        runs = client.search_runs([experiment.experiment_id], max_results=1000)
        parents = [r for r in runs if r.data.tags.get("paiexp.kind") == "sweep"]
        children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        return parents, children


def host_of(trial: Any) -> str:
    return str(trial.user_attrs.get(OWNER, "")).split(":")[0]


@pytest.fixture
def shared(
    tmp_path: Path, request: pytest.FixtureRequest, postgres: Postgres, mlflow_server: str
) -> Iterator[SharedSweep]:
    """A project whose sweep's study is a new PostgreSQL database; its launchers are killed
    at the end if a test left any running."""
    name = request.node.name.replace("test_", "", 1)[:40]
    sweep = {
        "params": {"x": "interval(-3, 3)", "duration": "interval(0.1, 0.3)", "steps": 3},
        "n_trials": N_TRIALS,
        "parallelism": 2,
        "sampler": {"name": "random"},
        "storage": postgres.database(name),
        "heartbeat_grace": GRACE,
    }
    root = synthetic_project(tmp_path, sweep)
    shared = SharedSweep(root, sweep["storage"], mlflow_server, name, Gates(tmp_path / "gates"), {})
    yield shared
    for launcher in shared.launchers.values():
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGCONT)
            launcher.kill()
            launcher.wait()


def test_three_hosts_run_one_study_to_exactly_n_trials(shared: SharedSweep) -> None:
    shared.start()
    # no job ends before every host runs a trial: the first two cannot take them all
    wait_until(lambda: all(map(shared.held_running, HOSTS)), 120, "every host to run a trial")
    with shared.gates.all_open():
        shared.wait(*HOSTS)

    trials = shared.assert_exact()
    assert {host_of(t) for t in trials} == set(HOSTS), "a launcher ran no trial"


def test_trials_of_a_sigkilled_launcher_are_adopted_and_complete(shared: SharedSweep) -> None:
    shared.start()
    wait_until(lambda: shared.held_running("host-a"), 120, "host-a to run a trial")
    shared.launchers["host-a"].send_signal(signal.SIGKILL)
    shared.launchers["host-a"].wait()
    orphans = shared.held_running("host-a")
    assert orphans, "host-a had no trial in flight when it was killed"
    # their jobs held running until adopted: the adopters follow them to their end
    wait_until(lambda: shared.adopted(orphans), 60, "host-a's trials to be adopted")
    with shared.gates.all_open():
        shared.wait("host-b", "host-c")

    trials = shared.assert_exact()
    adopters = {t.number: host_of(t) for t in trials if t.number in orphans}
    assert set(adopters.values()) <= {"host-b", "host-c"}, adopters
    said = shared.said("host-b") + shared.said("host-c")
    for number in orphans:
        assert f"trial {number}: its launcher host-a:" in said, said


def test_a_launcher_back_late_leaves_its_trials_to_their_adopters(shared: SharedSweep) -> None:
    shared.start()
    wait_until(lambda: shared.held_running("host-a"), 120, "host-a to run a trial")
    shared.launchers["host-a"].send_signal(signal.SIGSTOP)
    numbers = shared.held_running("host-a")
    assert numbers, "host-a had no trial in flight when it was stopped"
    wait_until(lambda: shared.adopted(numbers), 60, "host-a's trials to be adopted while stopped")
    shared.launchers["host-a"].send_signal(signal.SIGCONT)
    # back while their jobs still run (held, none can end), it finds them taken
    took = [f"trial {n}: another launcher took" for n in numbers]
    wait_until(lambda: all(t in shared.said("host-a") for t in took), 120, "host-a to leave them")
    with shared.gates.all_open():
        shared.wait(*HOSTS)

    trials = {t.number: t for t in shared.assert_exact()}  # host-a neither told them
    assert all(host_of(trials[n]) != "host-a" for n in numbers)  # nor stopped their jobs
