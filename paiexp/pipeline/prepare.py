"""A pipeline checked whole before anything runs, and each step made ready to run.

Every step is checked in dependency order: its references (to steps it depends on, and to
results they have), its config composed with placeholders standing in for earlier steps'
results, and its job or sweep validated as a single run or sweep would be.  Then the state
of an earlier launch is checked against it (see :mod:`paiexp.pipeline.resume`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from paiexp.backends import create_backend
from paiexp.config.compose import Project, to_container, to_object
from paiexp.config.schema import Config, TrackerConfig
from paiexp.config.spec import build_spec
from paiexp.errors import UserError
from paiexp.pipeline.graph import Graph, Step, build_graph
from paiexp.pipeline.naming import config_digest, instance_token, job_name, study_name
from paiexp.pipeline.shapes import Shape, check_reference, job_shape, sweep_shape
from paiexp.pipeline.state import PipelineState
from paiexp.pipeline.step_config import StepConfigs
from paiexp.runs import PreparedJob
from paiexp.sweep.prepared import PreparedSweep, prepare_sweep


@dataclass(frozen=True)
class PreparedStep:
    step: Step
    data: dict[str, Any]  # the resolved config, as its run stores it
    digest: str
    attempt: int
    job: PreparedJob | None
    sweep: PreparedSweep | None
    shape: Shape

    @property
    def config(self) -> Config:
        return self.job.config if self.job is not None else self.sweep.config  # type: ignore[union-attr]

    @property
    def handle(self) -> str:
        """What the step runs as: its job's name, or its sweep's study name."""
        if self.job is not None:
            return self.job.spec.name
        assert self.sweep is not None
        return self.sweep.study_name


class StepPreparer:
    """Turns a step and its dependencies' results into a PreparedStep."""

    def __init__(
        self, project: Project, overrides: Sequence[str], graph: Graph, state: PipelineState
    ) -> None:
        self.configs = StepConfigs(project, overrides)
        self.base_dir = project.base_dir
        self.overrides = tuple(overrides)
        self.graph = graph
        self.state = state
        self.output_uri = project.base_dir.as_uri()  # a placeholder that exists everywhere

    def prepare(self, step: Step, results: Mapping[str, Any], attempt: int) -> PreparedStep:
        cfg = self.configs.resolve(step, results)
        token = instance_token(self.state.pipeline_id, step.name, attempt)
        if step.sweep is not None and cfg.sweep.study_name is None:
            cfg.sweep.study_name = study_name(self.graph.name, step.name, token)
        config = to_object(cfg)
        data = to_container(cfg)
        digest = config_digest(step.kind, data)
        if step.sweep is not None:
            sweep = prepare_sweep(cfg, config, self.base_dir, self.overrides)
            point = sweep.space.first_point()
            channels = sweep.trials.spec(point, "probe").output_channels
            objectives = [o.metric for o in sweep.objectives]
            shape = sweep_shape(sweep.study_name, objectives, point, channels, self.output_uri)
            return PreparedStep(step, data, digest, attempt, None, sweep, shape)
        name = job_name(config.job.name, step.name, token)
        spec = build_spec(config.job, name=name, base_dir=self.base_dir)
        backend = create_backend(config.backend, self.base_dir)
        backend.validate(spec)
        job = PreparedJob(config, data, spec, backend, self.base_dir, self.overrides)
        metrics = spec.metric_names
        written = [str(n) for n in config.job.output_parameters]
        hyperparameters = data["job"]["hyperparameters"]
        channels = spec.output_channels
        shape = job_shape(name, metrics, written, channels, hyperparameters, self.output_uri)
        return PreparedStep(step, data, digest, attempt, job, None, shape)


@dataclass(frozen=True)
class PreparedPipeline:
    graph: Graph
    preparer: StepPreparer
    state: PipelineState
    tracker: TrackerConfig
    source: Path  # the pipeline file
    overrides: tuple[str, ...]


def prepare_pipeline(
    project: Project, overrides: Sequence[str], cfg: DictConfig
) -> PreparedPipeline:
    """Check the whole pipeline; nothing is created."""
    if cfg.sweep is not None:
        raise UserError(
            "sweep: a pipeline's steps select their sweeps (sweep: NAME in a step); "
            "drop +sweep= from the command line"
        )
    graph = build_graph(cfg.pipeline)
    state = PipelineState.load(project.base_dir, graph.name)
    preparer = StepPreparer(project, overrides, graph, state)
    shapes: dict[str, Shape] = {}
    tracker: TrackerConfig | None = None
    for step in graph.steps.values():
        ancestors = graph.ancestors(step.name)
        for key, reference in step.references():
            if reference.step not in graph.steps:
                raise UserError(
                    f"{key}: {reference}: no step {reference.step!r}; "
                    f"steps: {', '.join(graph.steps)}"
                )
            if reference.step not in ancestors:
                raise UserError(
                    f"{key}: {reference}: {step.name} does not depend on {reference.step}; "
                    "add it to depends"
                )
            check_reference(reference, shapes[reference.step], key)
        record = state.steps.get(step.name)
        upstream = {name: shapes[name] for name in ancestors}
        prepared = preparer.prepare(step, upstream, record.attempt if record else 0)
        shapes[step.name] = prepared.shape
        tracker = tracker or prepared.config.tracker
    assert tracker is not None
    source = project.pipelines_dir / f"{_selected(overrides)}.yaml"
    return PreparedPipeline(graph, preparer, state, tracker, source, tuple(overrides))


def _selected(overrides: Sequence[str]) -> str:
    """The pipeline the overrides select (the last, as Hydra's last override wins)."""
    from paiexp.config.files import PIPELINES

    return PIPELINES.selected(overrides)[-1]
