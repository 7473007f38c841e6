"""The way back from a sweep: its best model in one step, and failures that say why.

Each test does what a user does next (the command, as typed) and asserts what they now see:
the lines printed, the exit code, and what MLflow holds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import all_runs, assert_one_line_error, clean_env, run_paiexp, wait_until
from gates import Gates, cleaned_up
from pipeline_helpers import write_pipeline
from sweep_helpers import load_study, sweep_runs, synthetic_project

from paiexp.util.jsonfiles import read_json

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

WITH_MODELS = {
    "params": {"x": "interval(-1, 1)", "duration": 0.2, "steps": 2, "model": "true"},
    "n_trials": 3,
    "parallelism": 2,
    "sampler": {"name": "random", "seed": 5},
}


def printed(label: str, text: str) -> str:
    found = re.search(rf"^{label}:\s+(.+)$", text, re.M)
    assert found, text
    return found.group(1).strip()


def test_the_summary_names_the_best_run_and_download_fetches_its_model(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, WITH_MODELS)
    done = run_paiexp(root, "+sweep=syn")
    assert done.returncode == 0, done.stderr

    study = load_study(root)
    best = study.best_trial
    (parent,), children = sweep_runs(root)
    run = next(c for c in children if c.data.tags["paiexp.trial_number"] == str(best.number))
    run_id = run.info.run_id
    assert printed("best run", done.stderr) == f"{run_id} (trial {best.number})"
    model_uri = printed("best model", done.stderr)
    assert model_uri == run.data.tags["paiexp.model_uri"]
    fetch = printed("fetch it", done.stderr)
    assert fetch.endswith(f"paiexp download {run_id} ./model"), fetch
    assert parent.data.tags["paiexp.best_run_id"] == run_id
    assert parent.data.tags["paiexp.best_model_uri"] == model_uri

    expected = f"x={best.params['x']}\n"
    said = f"is the parent run of sweep syn: its best trial is trial {best.number}, run {run_id}"
    for target, dest in ((parent.info.run_id, "by-parent"), ("syn", "by-name"), (run_id, "trial")):
        got = run_paiexp(root, "download", target, dest)
        assert got.returncode == 0, got.stderr
        assert (said in got.stdout) is (target != run_id), got.stdout
        assert (root / dest / "model.txt").read_text() == expected

    # the command exactly as printed, from the project directory
    got = subprocess.run(
        fetch.replace("./model", "./as-printed").split(),
        cwd=root,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    assert (root / "as-printed" / "model.txt").read_text() == expected


def test_a_sweep_whose_trials_all_fail_exits_1_showing_the_scripts_own_error(
    tmp_path: Path,
) -> None:
    sweep = {"params": {"x": "interval(0, 1)", "duration": 0.1}, "n_trials": 3, "parallelism": 1}
    root = synthetic_project(tmp_path, sweep)
    (root / "synthetic" / "job.py").write_text("print('starting')\ndef broken(:\n")
    done = run_paiexp(root, "+sweep=syn")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr.split("the last lines of its log")[0]
    fails = [line for line in done.stderr.splitlines() if re.match(r"trial\s+\d+ FAIL", line)]
    assert len(fails) == 3 and all("SyntaxError: invalid syntax" in f for f in fails), fails
    assert done.stderr.count("the first failure, trial 0: command exited with code 1") == 1
    tail = done.stderr.split("the last lines of its log", 1)[1].splitlines()
    assert any("def broken(:" in line for line in tail), done.stderr
    assert done.stderr.count("the last lines of its log") == 1
    ((parent,), _) = sweep_runs(root)
    assert parent.info.status == "FAILED"


def test_an_objective_that_never_matches_shows_the_logs_last_line(tmp_path: Path) -> None:
    sweep = {"params": {"x": "interval(0, 1)", "duration": 0.1, "silent": True}, "n_trials": 2}
    root = synthetic_project(tmp_path, sweep)
    done = run_paiexp(root, "+sweep=syn")
    assert done.returncode == 1, done.stderr
    fails = [line for line in done.stderr.splitlines() if re.match(r"trial\s+\d+ FAIL", line)]
    assert len(fails) == 2, done.stderr
    for line in fails:  # the regex, and the line the log ended with (never an empty "tail")
        assert "never matched regex 'score=([-+0-9.eE]+|nan)'" in line, line
        assert re.search(r"the log's last line: 'loss=[0-9.]+'", line), line


def test_a_single_run_warns_of_each_metric_that_never_matched(tmp_path: Path) -> None:
    job = {
        "metric_definitions": [
            {"name": "loss", "regex": r"loss=([-+0-9.eE]+)"},
            {"name": "test_auc", "regex": r"test_auc=([-+0-9.eE]+)"},
            {"name": "precision", "regex": r"precision@5 ([0-9.]+)"},
        ],
        "command": "python job.py; echo 'test-auc: 0.981'",
    }
    root = synthetic_project(tmp_path, {"params": {}}, job)
    done = run_paiexp(root, "-q", "job.hyperparameters.duration=0.1")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "never matched" in line]
    assert len(warnings) == 2, done.stderr
    auc, f1 = warnings
    assert "metric 'test_auc' never matched regex 'test_auc=([-+0-9.eE]+)'" in auc
    assert "closest line: 'test-auc: 0.981'" in auc, auc
    assert "metric 'precision' never matched" in f1 and "no line looks like it" in f1, f1
    (run,) = all_runs(root)
    assert "test_auc" in run.data.tags["paiexp.warning"]


def test_quiet_still_shows_why_a_job_failed(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {}})
    done = run_paiexp(root, "-q", "job.hyperparameters.duration=three")
    assert done.returncode == 1, done.stderr
    assert "command exited with code 1" in done.stderr
    tail = done.stderr.split("the last lines of its log", 1)
    assert len(tail) == 2, done.stderr
    assert "ValueError: could not convert string to float: 'three'" in tail[1], done.stderr


def test_a_pipelines_parent_run_is_named_apart_and_never_taken_for_a_job(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {"x": "interval(0, 1)"}, "n_trials": 1})
    write_pipeline(root, "syn", {"train": {"overrides": {"job": {"hyperparameters": {"x": 1}}}}})
    assert run_paiexp(root, "+pipeline=syn").returncode == 0
    assert run_paiexp(root, "+sweep=syn").returncode == 0
    runs = all_runs(root)
    names = {r.data.tags.get("paiexp.kind"): r.info.run_name for r in runs}
    assert names["pipeline"] == "pipeline-syn" and names["sweep"] == "syn"
    pipeline = next(r for r in runs if r.data.tags.get("paiexp.kind") == "pipeline")
    step = next(r for r in runs if r.data.tags.get("paiexp.pipeline_step") == "train")
    line = assert_one_line_error(run_paiexp(root, "download", pipeline.info.run_id, "m"))
    assert "is the parent run of pipeline syn, which has no outputs of its own" in line, line
    assert f"train {step.info.run_id}" in line, line
    assert "may not have finished" not in line and not (root / "m").exists()


def test_an_unquoted_value_with_spaces_says_to_quote_it(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {}})
    line = assert_one_line_error(run_paiexp(root, "job.command=sleep", "15"))
    assert "'15' is not KEY=VALUE: a value with spaces must be one shell word" in line, line
    assert "'job.command=sleep 15 ...'" in line, line


def test_pai_images_without_a_network_is_one_line(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {}})
    env = clean_env(ALIBABA_CLOUD_ACCESS_KEY_ID="id", ALIBABA_CLOUD_ACCESS_KEY_SECRET="secret")
    done = run_paiexp(
        root,
        "images",
        "backend=pai",
        "backend.endpoint=127.0.0.1:9",  # nothing answers there
        "backend.workspace_endpoint=127.0.0.1:9",
        "backend.retry.attempts=2",
        "backend.retry.base_delay=0.01",
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "still failing after 2 attempts" in done.stderr, done.stderr
    assert "check the network" in done.stderr


def held_job_of(root: Path, gates: Gates, number: int) -> Path:
    """Trial ``number``'s job, once it is held at its gate (its state names the held pid)."""

    def held() -> Path | None:
        trials = load_study(root).trials
        name = trials[number].user_attrs.get("paiexp:job_name") if len(trials) > number else None
        state = read_json(root / ".paiexp" / "jobs" / name / "state.json") if name else None
        pid = (state or {}).get("pid")
        return next((job for job in gates.held() if gates.pid(job) == pid), None)

    return wait_until(held, 120, f"trial {number}'s job to be held")


def test_a_tie_names_the_same_best_trial_everywhere(tmp_path: Path) -> None:
    sweep = {
        "params": {"x": 0.5, "duration": "choice(0.1, 0.6)"},  # one score
        "n_trials": 4,
        "parallelism": 2,
        "sampler": {"name": "random", "seed": 1},
    }
    root = synthetic_project(tmp_path, sweep)
    gates = Gates(tmp_path / "gates")  # trial 1 ends before trial 0, by the test's hand
    output = tmp_path / "launcher.txt"
    with output.open("w") as stream:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "paiexp", "+sweep=syn"],
            cwd=root,
            env=clean_env(**gates.env()),
            stdout=subprocess.DEVNULL,
            stderr=stream,
        )
    with cleaned_up(gates, [launcher]):
        gates.wait_held(2)
        first, second = held_job_of(root, gates, 0), held_job_of(root, gates, 1)
        gates.open([second])
        wait_until(
            lambda: load_study(root).trials[1].state.name == "COMPLETE", 120, "trial 1 to end"
        )
        assert load_study(root).trials[0].state.name == "RUNNING" and first in gates.held()
        with gates.all_open():
            code = launcher.wait(timeout=120)
    said = output.read_text()
    assert code == 0, said
    status = re.findall(r"best score=0\.25 \(trial (\d+)\)", said)
    assert status and status[-1] == "0", said  # the final status line's best
    assert printed("best run", said).endswith("(trial 0)")
    duration = load_study(root).trials[0].params["duration"]
    assert printed("best params", said) == f"duration={duration:g}"
    (parent,), _ = sweep_runs(root)
    assert parent.data.tags["paiexp.best_trial"] == "0"


def test_a_grid_prints_no_third_party_warnings(tmp_path: Path) -> None:
    root = synthetic_project(tmp_path, {"params": {}})
    done = run_paiexp(
        root, "-m", "job.hyperparameters.x=0.5", "job.hyperparameters.duration=0.1,0.2"
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "warn(" not in done.stderr, done.stderr


def test_the_starter_project_ignores_reports_and_the_readme_installs_them(tmp_path: Path) -> None:
    project = tmp_path / "p"
    assert run_paiexp(tmp_path, "init", str(project)).returncode == 0
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / "reports").mkdir()
    (project / "reports" / "xgb.html").write_text("<html></html>")
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "reports/" not in status.stdout, status.stdout

    from conftest import REPO

    readme = (REPO / "README.md").read_text()
    main_install = re.search(
        r"pip install -e '\.\[([^\]]+)\]' && \S+ -m paiexp \+sweep=xgb", readme
    )
    assert main_install, "the README's main command"
    extras = yaml.safe_load("[" + main_install.group(1) + "]")
    assert "report" in extras  # paiexp report works after the main install
