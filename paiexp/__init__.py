"""paiexp: config-driven experiments and Optuna sweeps for Alibaba Cloud PAI, tracked in MLflow.

Importing the package is cheap: MLflow, Optuna and the cloud SDKs load only when a job runs.
"""

from __future__ import annotations

__version__ = "0.1.0"
