"""Hydra's command-line conventions, as Hydra's docs give them (hydra.cc, "Hydra's command
line flags", "Multi-run"): ``--config-dir/-cd`` adds a directory to the config search path
(the primary one stays first), ``--config-path/-cp`` names the primary directory, ``--info``
prints the search path and the defaults list, ``-m/--multirun`` runs every combination of
the sweep overrides (``a,b,c``, ``choice(...)``, ``range(...)``, last key fastest)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO, assert_nothing_started, run_paiexp
from sweep_helpers import load_study, sweep_runs, synthetic_project

from paiexp.config.compose import compose, locate_project
from paiexp.errors import UserError
from paiexp.sweep.multirun import Grid, apply_grid, split_multirun

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command


def hydra_project(root: Path) -> Path:
    for name in ("conf", "examples", "sweeps"):
        shutil.copytree(REPO / name, root / name)
    extra = root / "extra" / "job"
    extra.mkdir(parents=True)
    (extra / "other.yaml").write_text(yaml.safe_dump({"name": "other-job", "command": "true"}))
    (extra / "xgb.yaml").write_text(yaml.safe_dump({"name": "shadowed", "command": "true"}))
    return root


def stdout_of(root: Path, *args: str) -> str:
    done = run_paiexp(root, *args, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


# -- --config-dir, --config-path, --info ---------------------------------------------------


def test_config_dir_adds_to_the_search_path_after_the_primary_one(tmp_path: Path) -> None:
    root = hydra_project(tmp_path)
    # a config only the added directory has is found; one both have is the primary's
    assert stdout_of(root, "-cd", "extra", "job=other", "--cfg", "job", "-p", "job.name") == (
        "other-job\n"
    )
    assert stdout_of(root, "--config-dir", "extra", "--cfg", "job", "-p", "job.name") == (
        "xgb-breast-cancer\n"
    )
    without = run_paiexp(root, "job=other", "--cfg", "job")
    assert without.returncode == 2 and "job=other" in without.stderr
    rows = [
        line.split("|")[1:3]
        for line in stdout_of(root, "-cd", "extra", "--info", "searchpath").splitlines()
        if line.startswith("| ")
    ]
    providers = [(p.strip(), path.strip()) for p, path in rows][1:]  # after the header
    assert providers == [
        ("hydra", "pkg://hydra.conf"),
        ("main", f"file://{root / 'conf'}"),
        ("command-line", f"file://{root / 'extra'}"),
        ("schema", "structured://"),
    ]
    assert_nothing_started(root)


def test_a_pipeline_step_takes_a_job_config_from_an_added_directory(tmp_path: Path) -> None:
    root = hydra_project(tmp_path)
    (root / "pipelines").mkdir()
    (root / "pipelines" / "extra.yaml").write_text(
        "pipeline:\n  steps:\n    a: {job: other}\n"
        "    b: {depends: [a], when: 'steps.a.nope == 1'}\n"
    )
    # the job config is found in the added directory; the next mistake is the one reported
    for args, mentions in [
        (("-cd", "extra"), "steps.a.nope"),
        ((), "no such job config 'other'"),
    ]:
        done = run_paiexp(root, *args, "+pipeline=extra", timeout=120)
        assert done.returncode == 2 and mentions in done.stderr, done.stderr
    assert_nothing_started(root)


def test_config_path_names_the_primary_directory(tmp_path: Path) -> None:
    root = hydra_project(tmp_path)
    project = root / "elsewhere"
    shutil.copytree(root / "conf", project / "configs")
    shutil.copytree(root / "sweeps", project / "sweeps")
    job = project / "configs" / "job" / "xgb.yaml"
    job.write_text(job.read_text().replace("name: xgb-breast-cancer", "name: elsewhere-job"))
    args = ("-cp", "elsewhere/configs", "--cfg", "job")
    assert stdout_of(root, *args, "-p", "job.name") == "elsewhere-job\n"
    # the project is the primary directory's parent: its sweeps/ are the ones found
    (project / "sweeps" / "only_here.yaml").write_text((root / "sweeps" / "xgb.yaml").read_text())
    assert "n_trials: 30" in stdout_of(root, *args, "+sweep=only_here")
    missing = run_paiexp(root, "-cp", "nowhere", "--cfg", "job")
    assert missing.returncode == 2 and "no config.yaml in" in missing.stderr
    assert_nothing_started(root)


def test_info_prints_the_search_path_defaults_list_and_config(tmp_path: Path) -> None:
    root = hydra_project(tmp_path)
    defaults = stdout_of(root, "--info", "defaults", "+sweep=xgb", "backend=docker")
    assert "Defaults List" in defaults
    listed = [line.split("|")[1].strip() for line in defaults.splitlines() if line[:2] == "| "]
    assert {"job/xgb", "backend/docker", "tracker/mlflow", "sweep/xgb"} <= set(listed)
    assert listed.index("config") < listed.index("sweep/xgb")  # appended, as +sweep adds it

    everything = stdout_of(root, "-i")
    for part in ("Config search path", "Defaults Tree", "Defaults List", "xgb-breast-cancer"):
        assert part in everything
    assert_nothing_started(root)


# -- -m / --multirun -----------------------------------------------------------------------


def test_sweep_overrides_become_a_grid_in_hydras_order() -> None:
    plain, grid = split_multirun(
        [
            "job.hyperparameters.max_depth=3,5",
            "job.name=x",
            "+job.hyperparameters.lr=range(0.1,0.35,0.1)",
            "job.instance_type=choice(a,'b c')",
            "job.hyperparameters.max_depth=range(1,4)",  # again: the last wins, as in Hydra
        ]
    )
    assert plain == ["job.name=x"]
    assert grid.params == {
        "lr": [0.1, 0.2, 0.3],
        "job.instance_type": ["a", "b c"],
        "max_depth": [1, 2, 3],
    }
    points = grid.points()
    assert len(points) == 18
    assert points[:3] == [
        {"lr": 0.1, "job.instance_type": "a", "max_depth": 1},
        {"lr": 0.1, "job.instance_type": "a", "max_depth": 2},
        {"lr": 0.1, "job.instance_type": "a", "max_depth": 3},
    ]
    assert points[-1] == {"lr": 0.3, "job.instance_type": "b c", "max_depth": 3}


def test_the_grid_becomes_the_sweep(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}, "parallelism": 3})
    project = locate_project(str(root / "conf"))
    grid = Grid({"x": [0.5, 0.0], "steps": [1, 2]})

    cfg = compose(project, ["sweep.parallelism=2"], multirun=True)  # no +sweep: a new one
    apply_grid(cfg, grid)
    sweep = cfg.sweep
    assert sweep.name == "multirun" and sweep.study_name.startswith("multirun-")
    assert sweep.parallelism == 2
    assert dict(sweep.objective) == {"metric": "loss", "direction": "minimize"}  # first metric
    assert sweep.sampler.name == "bruteforce"
    assert sweep.n_trials == 4
    assert [dict(p) for p in sweep.enqueue] == grid.points()
    assert dict(sweep.params["x"]) == {"type": "categorical", "choices": [0.5, 0.0]}
    again = compose(project, [], multirun=True)
    apply_grid(again, grid)
    assert again.sweep.study_name != sweep.study_name  # each launch its own study

    chosen = compose(
        project,
        ["sweep.objective={metric: score, direction: maximize}", "sweep.study_name=grid1"],
        multirun=True,
    )
    apply_grid(chosen, grid)
    assert dict(chosen.sweep.objective) == {"metric": "score", "direction": "maximize"}
    assert chosen.sweep.study_name == "grid1"

    from_file = compose(
        project, ["+sweep=syn", "+sweep.sampler.options.n_startup_trials=1"], multirun=True
    )
    apply_grid(from_file, grid)  # the sweep's settings, the grid's params and sampler
    assert from_file.sweep.name == "syn" and from_file.sweep.parallelism == 3
    assert dict(from_file.sweep.objective) == {"metric": "score", "direction": "minimize"}
    assert set(from_file.sweep.params) == {"x", "steps"}
    assert from_file.sweep.sampler.name == "bruteforce" and not from_file.sweep.sampler.options


def test_a_grid_without_a_metric_to_rank_by_is_a_user_error(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}})
    project = locate_project(str(root / "conf"))
    cfg = compose(project, ["job.metric_definitions=[]"], multirun=True)
    with pytest.raises(UserError, match=r"sweep\.objective: .*job\.metric_definitions"):
        apply_grid(cfg, Grid({"x": [1, 2]}))


def test_multirun_runs_every_combination_as_one_tracked_sweep(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}})
    done = run_paiexp(
        root, "-m", "job.hyperparameters.x=0.5,0,1", "job.hyperparameters.duration=0.1"
    )
    assert done.returncode == 0, done.stderr
    assert "sweep 3/3 done (3 complete, 0 pruned)" in done.stderr

    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(root / "optuna.journal")))
    [name] = optuna.study.get_all_study_names(storage)
    assert name.startswith("multirun-")
    study = load_study(root, name)
    assert [(t.state.name, t.params["x"]) for t in study.trials] == [
        ("COMPLETE", 0.5),
        ("COMPLETE", 0),
        ("COMPLETE", 1),
    ]
    assert study.best_trial.params == {"x": 0}  # the first metric (loss), minimized
    [parent], children = sweep_runs(root)
    assert len(children) == 3
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert sorted(c.data.params["x"] for c in children) == ["0", "0.5", "1"]
