"""Pipelines: steps (jobs and sweeps) run in dependency order, each on its condition over
earlier steps' results, resumable, tracked as one MLflow parent run with a child per step.

``pipelines/NAME.yaml`` is selected with ``+pipeline=NAME``; :mod:`.prepare` checks the whole
pipeline before anything runs and :mod:`.runner` runs it.
"""
