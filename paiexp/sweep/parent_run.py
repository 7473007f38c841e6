"""The parent run of a sweep: what it is created with (tags and params) and opened by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paiexp.redact import redact_url

if TYPE_CHECKING:
    from paiexp.sweep.launcher import PreparedSweep


@dataclass(frozen=True)
class ParentRun:
    """``create``: the run's name, tags and params when it is new; ``invocation``: the
    tags that describe this launch, set again on a resumed run."""

    create: dict[str, Any]
    invocation: dict[str, str]


def parent_run(prepared: PreparedSweep, backend_name: str) -> ParentRun:
    """The sweep's settings and search space, as the parent run records them."""
    sweep = prepared.sweep
    storage = redact_url(prepared.storage)
    invocation = {
        "paiexp.n_trials": str(sweep.n_trials),
        "paiexp.parallelism": str(sweep.parallelism),
        "paiexp.timeout": str(sweep.timeout),
        "paiexp.backend": backend_name,
        "paiexp.storage": storage,
        "paiexp.study_name": prepared.study_name,
    }
    pruned_metric = prepared.pruning.metric if prepared.pruning else "-"
    params: dict[str, Any] = {
        "sweep.name": sweep.name,
        "sweep.objective": ", ".join(f"{o.metric} ({o.direction})" for o in prepared.objectives),
        "sweep.sampler": f"{sweep.sampler.name} seed={sweep.sampler.seed} "
        f"{dict(sweep.sampler.options)}",
        "sweep.pruner": f"{sweep.pruner.name} on {pruned_metric} {dict(sweep.pruner.options)}",
        "sweep.storage": storage,
        "sweep.study_name": prepared.study_name,
    }
    params.update({f"space.{n}": p.describe() for n, p in prepared.space.params.items()})
    create = {"study_name": prepared.study_name, "tags": invocation, "params": params}
    return ParentRun(create, invocation)
