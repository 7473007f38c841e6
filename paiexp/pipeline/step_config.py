"""A step's config: the project's config composed with the step's selection (``+sweep=NAME``,
``job=NAME``) and the command line's overrides, then the step's own overrides merged on top,
their ``${steps...}`` references resolved by OmegaConf against earlier steps' results."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paiexp.config.compose import Project, compose, describe_error
from paiexp.config.files import SWEEPS
from paiexp.errors import UserError
from paiexp.pipeline.graph import Step

# The job's mappings whose names are the user's (hyperparameters, channels, ...).
OPEN_MAPPINGS = ("hyperparameters", "inputs", "outputs", "environments", "labels")


class StepConfigs:
    """Each step's composed config (composed once per selection, in the calling thread:
    Hydra's composition is not thread-safe)."""

    def __init__(self, project: Project, overrides: Sequence[str]) -> None:
        self.project = project
        self.overrides = tuple(overrides)
        self._composed: dict[tuple[str, ...], DictConfig] = {}

    def base(self, step: Step) -> DictConfig:
        """The step's config before its own overrides."""
        selection: list[str] = []
        if step.sweep is not None:
            sweeps = SWEEPS.available(self.project.sweeps_dir)
            if step.sweep not in sweeps:
                raise UserError(
                    f"{step.key('sweep')}: no such sweep {step.sweep!r}; "
                    f"available: {', '.join(sweeps) or 'none'}"
                )
            selection.append(f"+sweep={step.sweep}")
        if step.job is not None:
            dirs = self.project.config_dirs
            jobs = sorted({p.stem for d in dirs for p in (d / "job").glob("*.yaml")})
            if step.job not in jobs:
                raise UserError(
                    f"{step.key('job')}: no such job config {step.job!r} in conf/job/; "
                    f"available: {', '.join(jobs) or 'none'}"
                )
            selection.append(f"job={step.job}")
        key = tuple(selection)
        if key not in self._composed:
            self._composed[key] = compose(self.project, [*self.overrides, *selection])
        return copy.deepcopy(self._composed[key])

    def resolve(self, step: Step, results: Mapping[str, Any]) -> DictConfig:
        """The step's full config: its overrides, references resolved, merged on its base."""
        cfg = self.base(step)
        cfg.pipeline = None
        for name in OPEN_MAPPINGS:  # overrides may add names, as a config file may
            OmegaConf.set_struct(cfg.job[name], False)
        for key, value in resolve_overrides(step, results).items():
            head = key.split(".", 1)[0]
            if head in ("pipeline", "tracker"):
                raise UserError(
                    f"{step.key('overrides')}.{key}: steps share the pipeline's "
                    f"{'tracker' if head == 'tracker' else 'definition'}; set it for all of them"
                )
            if head == "sweep" and step.sweep is None:
                raise UserError(
                    f"{step.key('overrides')}.{key}: a job step has no sweep; "
                    "add sweep: NAME to the step to make it a sweep"
                )
            try:
                OmegaConf.update(cfg, key, value, merge=True)
            except OmegaConfBaseException as exc:
                raise UserError(f"{step.key('overrides')}: {describe_error(exc)}") from None
        for name in OPEN_MAPPINGS:
            cfg.job[name]._set_flag("struct", None)
        return cfg


def resolve_overrides(step: Step, results: Mapping[str, Any]) -> dict[str, Any]:
    """The step's overrides as plain data, each ``${steps...}`` replaced by its value."""
    try:
        context = OmegaConf.create({"steps": dict(results), "overrides": step.overrides})
        resolved = OmegaConf.to_container(context.overrides, resolve=True)
    except OmegaConfBaseException as exc:
        problem = describe_error(exc).split(": ", 1)[-1]
        raise UserError(f"{step.key('overrides')}: {problem}") from None
    assert isinstance(resolved, dict)
    return {str(key): value for key, value in resolved.items()}
