"""A pipeline's steps and their dependencies, checked: names, ``depends``, cycles, ``when``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from paiexp.errors import UserError
from paiexp.pipeline.condition import Condition, Reference, parse_condition
from paiexp.pipeline.references import override_references

STEP_NAME_HELP = "letters, digits and '_', starting with a letter (steps.NAME refers to it)"


@dataclass(frozen=True)
class Step:
    name: str
    job: str | None  # conf/job/NAME.yaml; None: the project's job
    sweep: str | None  # sweeps/NAME.yaml: a sweep step
    depends: tuple[str, ...]
    when: Condition | None
    overrides: dict[str, Any]  # as written: ${steps...} not yet resolved

    @property
    def kind(self) -> str:
        return "sweep" if self.sweep else "job"

    def key(self, field: str) -> str:
        return f"pipeline.steps.{self.name}.{field}"

    def references(self) -> Iterator[tuple[str, Reference]]:
        """Every reference to another step's results, with the key it is written at."""
        if self.when is not None:
            for reference in self.when.references:
                yield self.key("when"), reference
        yield from override_references(self.overrides, self.key("overrides"))


@dataclass(frozen=True)
class Graph:
    name: str
    steps: dict[str, Step]  # in an order where each step comes after its dependencies

    def ancestors(self, name: str) -> set[str]:
        found: set[str] = set()
        todo = list(self.steps[name].depends)
        while todo:
            step = todo.pop()
            if step not in found:
                found.add(step)
                todo.extend(self.steps[step].depends)
        return found

    def descendants(self, name: str) -> set[str]:
        return {other for other in self.steps if name in self.ancestors(other)}


def build_graph(node: DictConfig) -> Graph:
    """The pipeline node of a composed config, checked; steps in dependency order."""
    steps: dict[str, Step] = {}
    for name, step in node.steps.items():
        name = str(name)
        key = f"pipeline.steps.{name}"
        if not name.isidentifier() or not name[0].isalpha():
            raise UserError(f"{key}: invalid step name {name!r}; use {STEP_NAME_HELP}")
        overrides = OmegaConf.to_container(step.overrides, resolve=False)
        assert isinstance(overrides, dict)
        when = step.when
        steps[name] = Step(
            name=name,
            job=step.job,
            sweep=step.sweep,
            depends=tuple(str(d) for d in step.depends),
            when=parse_condition(when, f"{key}.when") if when is not None else None,
            overrides={str(k): v for k, v in overrides.items()},
        )
    if not steps:
        raise UserError("pipeline.steps: a pipeline needs at least one step")
    for step in steps.values():
        for dependency in step.depends:
            if dependency not in steps:
                raise UserError(
                    f"{step.key('depends')}: unknown step {dependency!r}; steps: {', '.join(steps)}"
                )
    return Graph(str(node.name), {name: steps[name] for name in _ordered(steps)})


def _ordered(steps: dict[str, Step]) -> list[str]:
    """Dependencies first, otherwise in the file's order; a cycle is a UserError naming it."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            cycle = [*visiting[visiting.index(name) :], name]
            raise UserError(f"pipeline.steps: a cycle of dependencies: {' -> '.join(cycle)}")
        visiting.append(name)
        for dependency in steps[name].depends:
            visit(dependency)
        visiting.pop()
        order.append(name)

    for name in steps:
        visit(name)
    return order
