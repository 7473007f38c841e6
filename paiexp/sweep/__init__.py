"""Sweeps: Optuna studies over a job, launched asynchronously, resumable, tracked in MLflow."""
