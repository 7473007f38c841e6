"""Where to look at what was tracked: the MLflow UI's pages of an experiment and a run.

The UI routes are those of the MLflow release paiexp pins (3.17: a hash router,
``#/experiments/<id>/runs``, ``#/experiments/<id>/runs/<run id>`` and
``#/experiments/<id>/models``).  A tracking server (http, https) serves them itself; any other
store needs ``mlflow ui``, which serves them on 127.0.0.1:5000 by default.

MLflow 3.17's UI opens a fresh browser in its GenAI view (traces, judges, agent versions);
the switch to its "Model training" view lives in the browser's storage, not in the experiment
(MLflow issue 24498).  Each URL here asks for that view (``?workflowType=machine_learning``,
which the UI reads before its stored choice), and the summary names the click that keeps it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from paiexp.util.redact import redact_url

LOCAL_UI = "http://127.0.0.1:5000"
TRAINING_VIEW = "?workflowType=machine_learning"  # the UI's "Model training" view
KEEP_THE_VIEW = (
    "  (in the UI, 'Model training' at the top of the sidebar keeps this view; it opens on GenAI)"
)


def ui_address(tracker_uri: str) -> tuple[str | None, str]:
    """(the command that serves the UI, None for a tracking server; the UI's base URL)."""
    if tracker_uri.startswith(("http://", "https://")):
        return None, redact_url(tracker_uri).rstrip("/")
    return f"{mlflow_command()} ui --backend-store-uri {redact_url(tracker_uri)}", LOCAL_UI


def runs_url(base: str, experiment_id: str) -> str:
    """The experiment's runs page (a sweep: its parent run, the trials nested under it)."""
    return f"{base}/#/experiments/{experiment_id}/runs{TRAINING_VIEW}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """One run's page (a sweep's parent run lists its child runs there)."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}{TRAINING_VIEW}"


def models_url(base: str, experiment_id: str) -> str:
    """The experiment's logged models (each trial's), with their metrics."""
    return f"{base}/#/experiments/{experiment_id}/models{TRAINING_VIEW}"


def browse_lines(
    tracker_uri: str, experiment_id: str | None, run_id: str | None = None
) -> list[str]:
    """What to run and open to see the experiment's runs (and ``run_id``'s page)."""
    command, base = ui_address(tracker_uri)
    lines = [f"browse runs:   {command}"] if command else []
    if experiment_id is None:
        return lines or [f"browse runs:   {base}"]
    prefix = "  then open:   " if command else "browse runs:   "
    lines.append(prefix + runs_url(base, experiment_id))
    if run_id:
        lines.append("  this run:    " + run_url(base, experiment_id, run_id))
    lines.append("  models:      " + models_url(base, experiment_id))
    lines.append(KEEP_THE_VIEW)
    return lines


def mlflow_command() -> str:
    """How to call this interpreter's ``mlflow`` (see :func:`console_command`)."""
    return console_command("mlflow")


def console_command(name: str) -> str:
    """``name`` when the one on PATH is this interpreter's, else the path of this
    interpreter's (a virtual environment that is not activated), relative when shorter."""
    own = Path(sys.executable).parent / name
    found = shutil.which(name)
    if not own.exists() or (found and Path(found).resolve() == own.resolve()):
        return name
    relative = os.path.relpath(own)
    return relative if not relative.startswith("..") else str(own)
