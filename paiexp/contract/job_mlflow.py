"""Where a job's own MLflow calls go (``mlflow.start_run``, ``mlflow.log_*``, ``autolog``).

Into its paiexp run, one of two ways:

- **merged** (every backend, and every sweep's trials): MLflow's file store in the job's
  outputs, ``/ml/output/paiexp_mlflow/mlruns`` (on PAI an output channel on OSS, which takes plain
  files where SQLite's locking fails). A script's ``start_run`` or ``autolog`` makes its own
  run there, and paiexp merges it into the job's run (:mod:`paiexp.tracking.store_merge`);
- **directly**, where paiexp made the run before the job and the job reaches the tracking
  server (``tracker.job_uri``): ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID`` (``start_run``
  then resumes that run, and autolog logs into it) and ``MLFLOW_EXPERIMENT_ID``, with the
  launcher's credentials for that server.

Either way the launcher's own MLflow variables never reach a job (they would send its calls
to a store nobody links to its run).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from paiexp.contract import layout as contract

RUN_ID = "MLFLOW_RUN_ID"
METRICS_DIR = "metrics"  # a run's metric files in MLflow's file store: EXPERIMENT/RUN/metrics/KEY
# Where a job's MLflow calls go: paiexp's alone to set.
ROUTING = ("MLFLOW_TRACKING_URI", RUN_ID, "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")
# How MLflow's client reaches a tracking server: what a job writing to it directly needs.
CREDENTIALS = (
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_AUTH",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
)


def environment(environments: Mapping[str, str], layout: contract.JobLayout) -> dict[str, str]:
    """The variables that send a job's MLflow calls to its store in ``layout``, unless its
    ``environments`` (the spec's) send them to its run directly."""
    if RUN_ID in environments:
        return {}
    return {"MLFLOW_TRACKING_URI": store_uri(layout), "MLFLOW_ALLOW_FILE_STORE": "true"}


def store_uri(layout: contract.JobLayout) -> str:
    """The ``file:`` URI of the job's own store in ``layout``."""
    return PurePosixPath(layout.mlflow_store).as_uri()


def inherited(env: Mapping[str, str]) -> dict[str, str]:
    """A launcher's environment without what would send a job's MLflow calls elsewhere."""
    return {k: v for k, v in env.items() if k not in ROUTING and k not in CREDENTIALS}


def direct(job_uri: str, run_id: str, experiment_id: str) -> dict[str, str]:
    """The variables of a job that writes into ``run_id`` at ``job_uri`` itself, with the
    launcher's credentials for the server (its secret-looking names are redacted wherever
    paiexp keeps a spec)."""
    env = {k: v for k, v in os.environ.items() if k in CREDENTIALS}
    env.update(
        {"MLFLOW_TRACKING_URI": job_uri, RUN_ID: run_id, "MLFLOW_EXPERIMENT_ID": experiment_id}
    )
    return env


def watched(relative: str) -> bool:
    """Whether a file of a job's store (``relative``: its ``/``-separated path in ``mlruns``)
    is one paiexp reads as the job runs: a run's metric file (``EXPERIMENT/RUN/metrics/KEY``),
    or a logged model's ``meta.yaml`` (that the job logged a model); not artifacts, nor models'
    files, which the merge at the job's end reads once."""
    parts = relative.split("/")
    if len(parts) < 3 or parts[0].startswith("."):
        return False
    return parts[2] == METRICS_DIR if parts[1] != "models" else parts[3:] == ["meta.yaml"]


def holds_logged_model(store: Path) -> bool:
    """Whether a job's own store (its ``mlruns``) holds a logged model (MLflow 3's layout:
    ``EXPERIMENT/models/MODEL_ID/meta.yaml``): autolog's, or a ``log_model`` call's."""
    return any(store.glob("*/models/*/meta.yaml"))
