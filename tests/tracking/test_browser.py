"""What a person sees in a browser (headless Chromium from Debian, its DOM dumped once the
page settled, and a screenshot): the MLflow UI at the URLs a sweep prints, in its "Model
training" view, and the HTML of `paiexp report`."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import mlflow_client, run_paiexp, wait_until
from servers import server_env
from sweep_helpers import sweep_runs, synthetic_project

pytestmark = pytest.mark.slow

N_TRIALS = 3
SWEEP = {
    "params": {"x": "interval(-1, 1)", "model": "true"},
    "n_trials": N_TRIALS,
    "parallelism": 2,
    "sampler": {"name": "random", "seed": 0},
}


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium (.ci/run installs it); without it these tests fail, never skip."""
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("no chromium on PATH: apt-get install chromium (.ci/run does)")
    return found


def headless(chromium: str, url: str, action: str, settle_ms: int) -> str:
    """Chromium's output for ``action`` (``--dump-dom``, ``--screenshot=PATH``) on the page
    as a 2400x1000 window shows it after ``settle_ms`` of virtual time (wide enough for the
    models table's metric columns beside the UI's assistant panel)."""
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--window-size=2400,1000",
            f"--virtual-time-budget={settle_ms}",
            action,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def page_text(chromium: str, url: str, settle_ms: int = 10_000) -> str:
    """The page's DOM once settled."""
    return headless(chromium, url, "--dump-dom", settle_ms)


def screenshot(chromium: str, url: str, path: Path, settle_ms: int = 10_000) -> Path:
    """A PNG of the page once settled."""
    headless(chromium, url, f"--screenshot={path}", settle_ms)
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 20_000
    return path


def assert_training_view(text: str) -> None:
    """The UI's "Model training" view (its sidebar: Runs, Models, Model registry), not its
    GenAI one (Judges, Agent versions, runs called "Evaluations")."""
    assert "Model registry" in text, text[:2000]
    for genai in ("Judges", "Agent versions", "Evaluations"):
        assert genai not in text, f"{genai!r} on the page: the GenAI view\n{text[:2000]}"


def visible(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", dom).split())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tracked synthetic sweep, and what its launch printed."""
    root = synthetic_project(tmp_path_factory.mktemp("browse"), SWEEP)
    done = run_paiexp(root, "+sweep=syn")
    assert done.returncode == 0, done.stderr
    return root, done.stderr


@pytest.fixture(scope="module")
def ui(swept: tuple[Path, str]) -> Iterator[tuple[str, str]]:
    """The `mlflow ui` command the sweep printed, run on a free port: (its base URL, the
    printed base URL it stands for)."""
    root, said = swept
    command = re.search(r"^browse runs:\s+(\S+ ui --backend-store-uri \S+)$", said, re.M)
    assert command, said
    port = free_port()
    argv = [*shlex.split(command.group(1)), "--port", str(port), "--workers", "1"]
    server = subprocess.Popen(
        argv,
        cwd=root,
        env=server_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its workers stopped with it
    )
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    try:
        wait_until(answers, 120, "mlflow ui answering /health")
        yield base, "http://127.0.0.1:5000"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_the_printed_urls_show_the_sweep_and_its_trials(
    chromium: str, swept: tuple[Path, str], ui: tuple[str, str], tmp_path: Path
) -> None:
    root, said = swept
    base, printed_base = ui
    (parent,), children = sweep_runs(root)
    experiment = parent.info.experiment_id
    kind = mlflow_client(root).get_experiment(experiment).tags.get("mlflow.experimentKind")
    assert kind == "custom_model_development"
    assert "'Model training' at the top of the sidebar" in said  # the click that keeps it

    def printed(label: str) -> str:
        found = re.search(rf"^\s+{label}:\s+(\S+)$", said, re.M)
        assert found, said
        assert found.group(1).endswith("?workflowType=machine_learning")
        return found.group(1).replace(printed_base, base)

    runs_url = printed("then open")
    assert runs_url.startswith(f"{base}/#/experiments/{experiment}/runs?")
    runs = visible(page_text(chromium, runs_url))
    assert_training_view(runs)
    assert re.search(rf"\b{parent.info.run_name}\b", runs), runs[:3000]
    assert f"{1 + N_TRIALS} matching runs" in runs, runs[:3000]  # the parent and its trials
    screenshot(chromium, runs_url, tmp_path / "runs.png")

    run_url = printed("this run")
    assert f"/#/experiments/{experiment}/runs/{parent.info.run_id}?" in run_url
    page = visible(page_text(chromium, run_url))
    assert_training_view(page)
    listed = re.search(r"Child runs (.*?) Source", page)
    assert listed, page[:3000]
    names = {c.info.run_name for c in children}
    assert len(names) == N_TRIALS
    assert set(re.split(r"\s*,\s*", listed.group(1).strip())) == names
    assert "best_score" in page, page[:3000]  # the sweep's own metric
    screenshot(chromium, run_url, tmp_path / "sweep.png")

    models_url = printed("models")
    models = visible(page_text(chromium, models_url))
    assert_training_view(models)
    jobs = {c.data.tags["paiexp.job_name"] for c in children}
    assert all(job in models for job in jobs), models[:3000]  # each trial's logged model
    assert "Ready" in models and "Source run" in models, models[:3000]
    assert all(f"trial-{n}" in models for n in range(N_TRIALS)), models[:3000]
    assert re.search(r"\bloss\b", models), models[:3000]  # a metric column of the models
    screenshot(chromium, models_url, tmp_path / "models.png")


def test_the_report_renders_its_plots_in_a_browser(chromium: str, swept: tuple[Path, str]) -> None:
    root, _ = swept
    done = run_paiexp(root, "report", "syn")
    assert done.returncode == 0, done.stderr
    dom = page_text(chromium, (root / "reports" / "syn.html").as_uri(), settle_ms=5_000)
    figures = len(re.findall(r'class="plot-container plotly"', dom))
    assert figures == 5, visible(dom)[:2000]  # history, importances, parallel, slices, timeline
    assert "Plotly is not defined" not in dom
