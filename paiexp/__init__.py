"""paiexp: config-driven experiments and Optuna sweeps for Alibaba Cloud PAI, tracked in MLflow.

The Python API (the command line's own code paths)::

    import paiexp

    job = paiexp.run(paiexp.from_project("job.hyperparameters.max_depth=4"))
    job.metrics, job.model_uri, job.download("./model")

    sweep = paiexp.start_sweep("+sweep=xgb")     # a detached launcher: returns at once
    sweep.counts(), sweep.results()              # a DataFrame, while it runs
    sweep.wait().best.params

Importing the package is cheap: MLflow, Optuna and the cloud SDKs load only when a job runs.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing itself is not loaded: a job's runner imports this package
if TYPE_CHECKING:
    from typing import Any

    from paiexp.api.jobs import Composed, Job, attach_job, from_project, job, run
    from paiexp.api.pipelines import Pipeline, attach_pipeline, start_pipeline
    from paiexp.api.sweeps import Best, Sweep, attach_sweep, start_sweep
    from paiexp.errors import ConfigError

__version__ = "0.1.0"

# The public names, each loaded from its module when first used: the package's own modules
# (a local job's runner imports one, without ``site``) must not pay for the API's imports.
# None is named as a module of the package is (paiexp.config.compose, paiexp.sweep): importing that
# module would replace the name.
_PUBLIC = {
    "Best": "paiexp.api.sweeps",
    "Composed": "paiexp.api.jobs",
    "ConfigError": "paiexp.errors",
    "Job": "paiexp.api.jobs",
    "Pipeline": "paiexp.api.pipelines",
    "Sweep": "paiexp.api.sweeps",
    "attach_job": "paiexp.api.jobs",
    "attach_pipeline": "paiexp.api.pipelines",
    "attach_sweep": "paiexp.api.sweeps",
    "from_project": "paiexp.api.jobs",
    "job": "paiexp.api.jobs",
    "run": "paiexp.api.jobs",
    "start_pipeline": "paiexp.api.pipelines",
    "start_sweep": "paiexp.api.sweeps",
}
__all__ = [
    "Best",
    "Composed",
    "ConfigError",
    "Job",
    "Pipeline",
    "Sweep",
    "attach_job",
    "attach_pipeline",
    "attach_sweep",
    "from_project",
    "job",
    "run",
    "start_pipeline",
    "start_sweep",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'paiexp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
