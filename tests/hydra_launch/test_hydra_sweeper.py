"""``hydra/sweeper=paiexp``: apps configured for hydra-optuna-sweeper, switched by one line of
their defaults, swept by paiexp's launcher (each trial a paiexp job re-running the app).

The apps are hydra-optuna-sweeper's examples (their task functions and their configs, spelt
here, and the upstream tests' commands): the sphere (TPE, the best value within the 95th
percentile upstream measured over 1000 seeds), the two-objective Binh and Korn, and a custom
search space that draws more parameters per trial.  Then what that sweeper cannot do: a
launcher SIGKILLed mid-sweep and launched again finishes the study with no job run twice.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import all_runs, clean_env, mlflow_client, wait_until
from gates import Gates, cleaned_up
from pipeline_helpers import starter_project
from test_hydra_apps import launcher_config, platform  # noqa: F401 (a fixture)

from paiexp.sweep.records import OWNER
from paiexp.util.processes import process_alive

pytestmark = pytest.mark.slow
HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."

SPHERE = """
import warnings

import hydra
from omegaconf import DictConfig
from optuna.exceptions import ExperimentalWarning

warnings.filterwarnings("ignore", category=ExperimentalWarning)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def sphere(cfg: DictConfig) -> float:
    if cfg.get("error", False):
        raise RuntimeError("cfg.error is True")
    return cfg.x**2 + cfg.y**2


if __name__ == "__main__":
    sphere()
"""
SPHERE_CONFIG = """
defaults:
  - override hydra/sweeper: paiexp
  - override hydra/sweeper/sampler: tpe

hydra:
  sweeper:
    sampler:
      seed: 123
    direction: minimize
    study_name: sphere
    storage: null
    n_trials: 20
    n_jobs: 1
    params:
      x: range(-5.5, 5.5, step=0.5)
      y: choice(-5 ,0 ,5)

x: 1
y: 1
z: 1
"""
BINH_AND_KORN = """
import hydra
from omegaconf import DictConfig


@hydra.main(config_path="multi-objective-conf", config_name="config")
def binh_and_korn(cfg: DictConfig) -> tuple[float, float]:
    return 4 * cfg.x**2 + 4 * cfg.y**2, (cfg.x - 5) ** 2 + (cfg.y - 5) ** 2


if __name__ == "__main__":
    binh_and_korn()
"""
BINH_AND_KORN_CONFIG = """
defaults:
  - override hydra/sweeper: paiexp
  - override hydra/sweeper/sampler: nsgaii

hydra:
  sweeper:
    sampler:
      seed: 123
    direction: [minimize, minimize]
    study_name: multi-objective
    storage: null
    n_trials: 20
    n_jobs: 1
    params:
      x: range(0, 5, step=0.5)
      y: range(0, 3, step=0.5)

x: 1
y: 1
"""
CUSTOM_SPACE = """
import hydra
from omegaconf import DictConfig
from optuna.trial import Trial


@hydra.main(config_path="custom-search-space", config_name="config")
def multi_dimensional_sphere(cfg: DictConfig) -> float:
    return cfg.w**2 + cfg.x**2 + cfg.y**2 + cfg.z**2


def configure(cfg: DictConfig, trial: Trial) -> None:
    x = trial.params["x"]
    trial.suggest_float("z", x - cfg.max_z_difference_from_x, x + cfg.max_z_difference_from_x)
    trial.suggest_float("+w", 0.0, 1.0)  # +w: w is no key of the config


if __name__ == "__main__":
    multi_dimensional_sphere()
"""
CUSTOM_SPACE_CONFIG = """
defaults:
  - override hydra/sweeper: paiexp

hydra:
  sweeper:
    sampler:
      seed: 123
    direction: minimize
    study_name: custom-search-space
    storage: null
    n_trials: 20
    n_jobs: 1

    params:
      x: range(-5.5, 5.5, 0.5)
      y: choice(-5, 0, 5)
    custom_search_space: .custom-search-space-objective.configure

x: 1
y: 1
z: 100
max_z_difference_from_x: 0.5
"""
EXAMPLES = {
    "sphere.py": (SPHERE, "conf", SPHERE_CONFIG),
    "multi-objective.py": (BINH_AND_KORN, "multi-objective-conf", BINH_AND_KORN_CONFIG),
    "custom-search-space-objective.py": (CUSTOM_SPACE, "custom-search-space", CUSTOM_SPACE_CONFIG),
}


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """The example apps, each beside its config directory."""
    for script, (code, config_dir, config) in EXAMPLES.items():
        (tmp_path / script).write_text(code)
        (tmp_path / config_dir).mkdir()
        (tmp_path / config_dir / "config.yaml").write_text(config)
    return tmp_path


def sweep(
    app: Path, script: str, *overrides: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT --multirun OVERRIDES`` into ``app/multirun``."""
    return subprocess.run(
        [sys.executable, script, "--multirun", "hydra.sweep.dir=multirun", *overrides],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=400,
        env=env or clean_env(),
    )


def results(app: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        (app / "multirun/optimization_results.yaml").read_text()
    )
    return loaded


def load(app: Path, study_name: str, storage: str | None = None) -> optuna.Study:
    return optuna.load_study(
        study_name=study_name,
        storage=storage
        or optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(app / "optuna.journal"))
        ),
    )


def dominates(a: list[float], b: list[float]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True)
    )


def test_installing_paiexp_registers_the_sweeper_as_hydra_lists_its_plugins(
    examples: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "sphere.py", "--info", "plugins"],
        cwd=examples,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    sweepers = done.stdout.split("Sweeper:")[1].split("\n\n")[0]
    assert "PaiexpSweeper" in sweepers.split()


def test_the_sphere_example_finds_what_the_optuna_sweeper_finds_on_its_budget(
    examples: Path,
) -> None:
    """The upstream test's command: 20 trials, one at a time, TPE seeded 123."""
    storage = f"sqlite:///{examples / 'test.db'}"
    done = sweep(
        examples,
        "sphere.py",
        "hydra.job.chdir=True",
        "hydra.sweeper.n_trials=20",
        "hydra.sweeper.n_jobs=1",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=test-optuna-example",
        "hydra/sweeper/sampler=tpe",
        "hydra.sweeper.sampler.seed=123",
        "~z",
    )
    assert done.returncode == 0, done.stderr
    study = load(examples, "test-optuna-example", storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 20
    found = results(examples)
    assert found["best_params"] == study.best_trial.params
    assert found["best_value"] == study.best_value
    assert found["best_value"] <= 2.27  # upstream's 95th percentile over 1000 seeds
    for trial in study.trials:  # each trial's Hydra job: its number, its point, its directory
        job_dir = examples / "multirun" / str(trial.number)
        overrides = yaml.safe_load((job_dir / ".hydra/overrides.yaml").read_text())
        assert overrides == ["~z", f"x={trial.params['x']}", f"y={trial.params['y']}"]
        assert trial.values == [trial.params["x"] ** 2 + trial.params["y"] ** 2]
        hydra_cfg = yaml.safe_load((job_dir / ".hydra/hydra.yaml").read_text())["hydra"]
        assert hydra_cfg["job"]["num"] == trial.number
    runs = all_runs(examples)
    parents = [r for r in runs if r.data.tags.get("paiexp.kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 20
    assert {c.info.status for c in children} == {"FINISHED"}
    assert parents[0].data.metrics["best_return_value"] == study.best_value


def test_the_command_lines_params_override_the_configs_a_fixed_value_fixed(
    examples: Path,
) -> None:
    done = sweep(
        examples,
        "sphere.py",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=3",
        "x=choice(0, 1, 2)",
        "y=0",
    )
    assert done.returncode == 0, done.stderr
    study = load(examples, "sphere")
    assert all(set(t.params) == {"x"} and t.params["x"] in (0, 1, 2) for t in study.trials)
    assert "y" not in results(examples)["best_params"]
    assert [t.values for t in study.trials] == [[t.params["x"] ** 2] for t in study.trials]


def test_the_starter_projects_hydra_app_sweeps_pruned_on_its_validation_loss(
    tmp_path: Path,
) -> None:
    app = starter_project(tmp_path) / "examples" / "hydra_xgb"
    done = sweep(app, "train.py", "hydra.sweeper.n_trials=5")
    assert done.returncode == 0, done.stderr
    study = load(app, "hydra-xgb")
    assert len(study.trials) == 5
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}
    # the pruner is fed each trial's validation loss, round by round, from its log
    assert all(len(t.intermediate_values) >= 20 for t in study.trials)
    assert 0.95 < study.best_value == results(app)["best_value"]

    # the objective a metric the job's log reports, by name, instead of the return value
    done = sweep(
        app,
        "train.py",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.study_name=by-metric",
        "hydra.sweeper.objective=test-auc",
    )
    assert done.returncode == 0, done.stderr
    values = [t.value for t in load(app, "by-metric").trials]
    assert len(values) == 2 and all(v == round(v, 6) > 0.95 for v in values)  # as printed


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest) -> list[str]:
    """The sweeper's overrides for each backend the trials run on: here, or in containers
    with Hydra and Optuna but no paiexp (the test image's hydra variant)."""
    if request.param == "local":
        return []
    image = request.getfixturevalue("hydra_image")
    return ["hydra.sweeper.backend=docker", f"hydra.sweeper.job.image={image}"]


def test_the_two_objective_example_finds_a_pareto_front(examples: Path, backend: list[str]) -> None:
    """Upstream's command (random sampler, seeded), fewer trials, two at a time."""
    done = sweep(
        examples,
        "multi-objective.py",
        "hydra.sweeper.n_trials=8",
        "hydra.sweeper.n_jobs=2",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=123",
        *backend,
    )
    assert done.returncode == 0, done.stderr
    study = load(examples, "multi-objective")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 8
    for trial in study.trials:
        x, y = trial.params["x"], trial.params["y"]
        assert trial.values == [4 * x**2 + 4 * y**2, (x - 5) ** 2 + (y - 5) ** 2]
        job_dir = examples / "multirun" / str(trial.number)  # fetched back from a container
        assert yaml.safe_load((job_dir / ".hydra/overrides.yaml").read_text()) == [
            f"x={x}",
            f"y={y}",
        ]
        assert (job_dir / "multi-objective.log").is_file()
    solutions = results(examples)["solutions"]
    assert sorted(map(str, solutions)) == sorted(
        str({"params": t.params, "values": t.values}) for t in study.best_trials
    )
    for a in solutions:
        assert a["params"]["x"] % 0.5 == 0 and a["params"]["y"] % 0.5 == 0
        assert not any(dominates(b["values"], a["values"]) for b in solutions)


@pytest.mark.usefixtures("hydra_image")
@pytest.mark.parametrize(
    "script, study_name",
    [("sphere.py", "sphere"), ("custom-search-space-objective.py", "custom-search-space")],
)
def test_the_other_examples_run_in_containers_as_they_are(
    examples: Path, hydra_image: str, script: str, study_name: str
) -> None:
    """The sphere and the custom search space on docker (their apps import Optuna: the
    image has it, as theirs would), two trials at once."""
    done = sweep(
        examples,
        script,
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.backend=docker",
        f"hydra.sweeper.job.image={hydra_image}",
    )
    assert done.returncode == 0, done.stderr
    study = load(examples, study_name)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    for trial in study.trials:
        # each app returns the sum of its swept values' squares
        assert trial.values == pytest.approx([sum(v**2 for v in trial.params.values())])
        assert (examples / "multirun" / str(trial.number) / ".hydra" / "config.yaml").is_file()


def test_on_a_platform_each_trial_runs_in_a_container_without_paiexp_its_directory_back(
    examples: Path,
    platform: tuple[list[str], dict[str, str]],  # noqa: F811 (test_hydra_apps' fixture)
) -> None:
    """The PAI emulator (the app's code uploaded once: see ``platform``) and a fake OpenPAI
    cluster: each trial a job in a container that has Hydra but no paiexp, its Hydra
    directory back from the platform's storage."""
    overrides, env = platform
    config = yaml.safe_load(BINH_AND_KORN_CONFIG)
    config["hydra"]["sweeper"].update(launcher_config(overrides))
    (examples / "multi-objective-conf" / "config.yaml").write_text(yaml.safe_dump(config))
    done = sweep(
        examples,
        "multi-objective.py",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=2",
        "hydra/sweeper/sampler=random",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    study = load(examples, "multi-objective")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    for trial in study.trials:
        overrides_file = examples / "multirun" / str(trial.number) / ".hydra/overrides.yaml"
        x, y = trial.params["x"], trial.params["y"]
        assert yaml.safe_load(overrides_file.read_text()) == [f"x={x}", f"y={y}"]
        assert trial.values == [4 * x**2 + 4 * y**2, (x - 5) ** 2 + (y - 5) ** 2]


def test_a_custom_search_space_draws_more_parameters_for_each_trial(examples: Path) -> None:
    """Upstream's command: ``z`` drawn near ``x`` and ``+w`` (a key the config lacks)."""
    difference = 0.3
    done = sweep(
        examples,
        "custom-search-space-objective.py",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.n_jobs=2",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=123",
        f"max_z_difference_from_x={difference}",
    )
    assert done.returncode == 0, done.stderr
    best = results(examples)["best_params"]
    assert abs(best["x"] - best["z"]) <= difference
    assert 0 <= best["+w"] <= 1
    study = load(examples, "custom-search-space")
    for trial in study.trials:
        p = trial.params
        assert trial.values == pytest.approx(
            [p["+w"] ** 2 + p["x"] ** 2 + p["y"] ** 2 + p["z"] ** 2]
        )


def test_failures_past_the_rate_fail_the_sweep_in_one_line(examples: Path) -> None:
    done = sweep(examples, "sphere.py", "hydra.sweeper.n_trials=4", "+error=true")
    assert done.returncode == 1
    assert "RuntimeError: cfg.error is True" in done.stderr  # the trial's log, shown
    last = done.stderr.strip().splitlines()
    assert "Traceback (most recent call last)" not in "\n".join(last[-3:])
    assert any(
        line.startswith("paiexp: the sweep failed: ") and "hydra.sweeper.max_failure_rate=0" in line
        for line in last
    ), done.stderr
    study = load(examples, "sphere")
    assert {t.state.name for t in study.trials} == {"FAIL"}

    tolerant = sweep(
        examples,
        "sphere.py",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.max_failure_rate=1.0",
        "hydra.sweeper.study_name=tolerant",
        "+error=true",
    )
    assert "paiexp: the sweep failed: no trial completed" in tolerant.stderr
    assert [t.state.name for t in load(examples, "tolerant").trials] == ["FAIL"] * 6


@pytest.mark.parametrize(
    "override, says",
    [
        (
            "hydra.sweeper.params.x='interval(1)'",
            "paiexp: error: hydra.sweeper.params.x: TypeError while evaluating 'interval(1)'",
        ),
        (
            "hydra.sweeper.sampler._target_=optuna.samplers.Nope",
            "paiexp: error: hydra.sweeper.sampler._target_: 'optuna.samplers.Nope' is not a "
            "sampler paiexp runs",
        ),
        ("hydra.sweeper.direction=up", "paiexp: error: hydra.sweeper.direction: invalid value"),
        ("hydra.sweeper.n_jobs=0", "paiexp: error: hydra.sweeper.n_jobs: must be >= 1, got 0"),
        (
            "hydra.sweeper.job.instance_count=0",
            "paiexp: error: hydra.sweeper.job.instance_count: invalid value 0",
        ),
        (
            "+db=choice(a, b)",
            "paiexp: error: +db=choice(a, b): a searched key must be a config key",
        ),
    ],
)
def test_bad_sweeper_settings_are_one_line_and_nothing_runs(
    examples: Path, override: str, says: str
) -> None:
    done = sweep(examples, "sphere.py", override)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0].startswith(says), done.stderr
    assert lines[1:] == [
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."
    ]
    made = {*EXAMPLES, *(config_dir for _, config_dir, _ in EXAMPLES.values())}
    assert {p.name for p in examples.iterdir()} == made


GATED = """
import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(version_base=None, config_path=".", config_name="config")
def gated(cfg):
    num = HydraConfig.get().job.num
    with open(os.environ["LEDGER"], "a") as ledger:
        ledger.write(json.dumps({"num": num, "x": cfg.x}) + "\\n")
    held = Path(os.environ["GATES"], f"{num}.held")
    Path(f"{held}.partial").write_text(str(os.getpid()))
    os.replace(f"{held}.partial", held)
    while not held.with_suffix(".open").exists():
        time.sleep(0.05)
    return (cfg.x - 0.25) ** 2


if __name__ == "__main__":
    gated()
"""
GATED_CONFIG = """
defaults:
  - override hydra/sweeper: paiexp

hydra:
  sweeper:
    sampler:
      seed: 7
    study_name: gated
    n_trials: 5
    n_jobs: 2
    params:
      x: interval(-1, 1)

x: 0
"""


def following(app: Path, pid: int) -> int:
    """How many RUNNING trials the launcher of process ``pid`` follows."""
    if not (app / "optuna.journal").exists():
        return 0
    try:
        trials = load(app, "gated").get_trials(deepcopy=False)
    except KeyError:  # no study yet
        return 0
    return sum(
        str(t.user_attrs.get(OWNER, "")).split(":")[1:2] == [str(pid)]
        for t in trials
        if t.state.name == "RUNNING"
    )


def test_a_sweep_whose_launcher_was_sigkilled_finishes_when_launched_again_no_job_twice(
    tmp_path: Path,
) -> None:
    (tmp_path / "gated.py").write_text(GATED)
    (tmp_path / "config.yaml").write_text(GATED_CONFIG)
    gates = Gates(tmp_path / "gates")
    ledger = tmp_path / "ledger.jsonl"
    env = clean_env(LEDGER=str(ledger), **gates.env())
    command = [sys.executable, "gated.py", "--multirun", "hydra.sweep.dir=multirun"]
    launcher = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    with cleaned_up(gates, [launcher]):
        wait_until(
            lambda: len(gates.held()) == 2 and following(tmp_path, launcher.pid) == 2,
            180,
            "the launcher to follow two trials, their jobs held",
        )
        in_flight = gates.held()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        # the premise: the killed launcher's two jobs run on, held
        assert all(process_alive(Gates.pid(job), None) for job in in_flight)
        with gates.all_open():
            again = subprocess.run(
                command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
            )
    assert again.returncode == 0, again.stderr
    study = load(tmp_path, "gated")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5
    runs = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted(run["num"] for run in runs) == list(range(5)), f"jobs ran: {runs}"
    assert {run["num"]: run["x"] for run in runs} == {t.number: t.params["x"] for t in study.trials}
    assert results(tmp_path)["best_value"] == study.best_value


def test_two_launchers_started_together_share_one_study(tmp_path: Path) -> None:
    """Two Hydra processes sweeping the same study at once, each two trials at a time: every
    trial run once, one MLflow parent for the study."""
    (tmp_path / "gated.py").write_text(GATED)
    (tmp_path / "config.yaml").write_text(GATED_CONFIG)
    gates = Gates(tmp_path / "gates")
    ledger = tmp_path / "ledger.jsonl"
    env = clean_env(LEDGER=str(ledger), **gates.env())
    launchers = [
        subprocess.Popen(
            [
                *(sys.executable, "gated.py", "--multirun"),
                f"hydra.sweep.dir=multirun-{index}",
                "hydra.sweeper.n_trials=6",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(2)
    ]
    with cleaned_up(gates, launchers):
        gates.wait_held(4, timeout=240)  # the premise: both launchers run both their trials
        owners = {t.user_attrs[OWNER] for t in load(tmp_path, "gated").trials}
        assert len(owners) == 2, owners
        with gates.all_open():
            for launcher in launchers:
                _, stderr = launcher.communicate(timeout=300)
                assert launcher.returncode == 0, stderr
    study = load(tmp_path, "gated")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    runs = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted(run["num"] for run in runs) == list(range(6)), f"jobs ran: {runs}"
    all_of_them = all_runs(tmp_path)
    parents = [r for r in all_of_them if r.data.tags.get("paiexp.kind") == "sweep"]
    children = [r for r in all_of_them if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 6
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}


CURVE = """
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
{imports}


def hold():
    held = Path(os.environ["GATES"], f"{{HydraConfig.get().job.num}}.held")
    Path(f"{{held}}.partial").write_text(str(os.getpid()))
    os.replace(f"{{held}}.partial", held)
    while not held.with_suffix(".open").exists():  # running, its curve written
        time.sleep(0.05)


@hydra.main(version_base=None, config_path=".", config_name="config")
def curve(cfg):
{curve}


if __name__ == "__main__":
    curve()
"""
# how an app writes its curve (val_loss, 5 points), and how its sweep's job declares it
CURVE_WRITERS = {
    "tensorboard": (
        "from tensorboardX import SummaryWriter",
        """\
    writer = SummaryWriter(os.environ["PAI_OUTPUT_TENSORBOARD"])
    for step in range(5):
        writer.add_scalar("val/loss", cfg.x * (5 - step), step)
    writer.close()  # its curve on disk, whole
    hold()""",
        "tensorboard: {metrics: [{name: val_loss, tag: val/loss}]}",
    ),
    "mlflow": (
        "import mlflow",
        """\
    with mlflow.start_run():  # as the app would on its own
        for step in range(5):
            mlflow.log_metric("val_loss", cfg.x * (5 - step), step=step)
        hold()""",
        "mlflow_metrics: [val_loss]",
    ),
}
CURVE_CONFIG = """
defaults:
  - override hydra/sweeper: paiexp

hydra:
  sweeper:
    study_name: curve
    objective: val_loss          # its last value, by name: the task returns nothing
    n_trials: 2
    n_jobs: 2
    params:
      x: interval(0, 1)
    pruner:
      name: median
      metric: val_loss
      options: {{n_startup_trials: 10}}
    job:
      {declared}

x: 0
"""


@pytest.mark.parametrize("source", sorted(CURVE_WRITERS))
def test_the_pruner_reads_the_curve_the_app_writes(tmp_path: Path, source: str) -> None:
    """Each trial writes its curve (TensorBoard scalars, or its own MLflow calls), then is
    held running until the launcher has reported every point to Optuna from what the app
    wrote; the objective is the curve, by name (the task returns nothing)."""
    imports, curve, declared = CURVE_WRITERS[source]
    (tmp_path / "curve.py").write_text(CURVE.format(imports=imports, curve=curve))
    (tmp_path / "config.yaml").write_text(CURVE_CONFIG.format(declared=declared))
    gates = Gates(tmp_path / "gates")
    command = [sys.executable, "curve.py", "--multirun", "hydra.sweep.dir=multirun"]
    launcher = subprocess.Popen(
        command, cwd=tmp_path, env=clean_env(**gates.env()), stderr=subprocess.PIPE, text=True
    )

    def reported() -> bool:
        trials = load(tmp_path, "curve").get_trials(deepcopy=False)
        return len(trials) == 2 and all(len(t.intermediate_values) == 5 for t in trials)

    with cleaned_up(gates, [launcher]):
        held = gates.wait_held(2, timeout=240)
        wait_until(reported, 120, "every point of both running trials reported")
        assert all(t.state.name == "RUNNING" for t in load(tmp_path, "curve").trials)
        gates.open(held)
        _, stderr = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, stderr
    study = load(tmp_path, "curve")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    for trial in study.trials:
        x = trial.params["x"]
        assert trial.intermediate_values == pytest.approx({s: x * (5 - s) for s in range(5)})
        assert trial.value == pytest.approx(x)  # the objective: the curve's last point
    client = mlflow_client(tmp_path)
    curves = {
        float(run.data.params["x"]): sorted(
            (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_loss")
        )
        for run in all_runs(tmp_path)
        if "mlflow.parentRunId" in run.data.tags
    }
    for x, points in curves.items():  # in each trial's run, each point once
        assert [step for step, _ in points] == list(range(5))
        assert [value for _, value in points] == pytest.approx([x * (5 - s) for s in range(5)])
    assert sorted(curves) == pytest.approx(sorted(t.params["x"] for t in study.trials))
