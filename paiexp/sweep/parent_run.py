"""The parent run of a sweep: what it is created with (tags and params) and opened by; and,
when several launchers share the study, which of its runs are this launcher's to write."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paiexp.sweep.opening import launcher_gone
from paiexp.sweep.records import OWNER
from paiexp.tracking.mlflow_tracker import STUDY_NAME_TAG
from paiexp.util.redact import redact_url

if TYPE_CHECKING:
    from optuna import Study

    from paiexp.sweep.prepared import PreparedSweep
    from paiexp.sweep.tracking_messages import FinishedTrial


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
        STUDY_NAME_TAG: prepared.study_name,
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


def left_by_launchers_gone(
    study: Study, trials: Iterable[FinishedTrial], owner: str
) -> list[FinishedTrial]:
    """The finished trials whose launcher is gone, for this launcher (``owner``) to check
    their runs: a live launcher closes its own trials' runs (its tracking may lag behind its
    trials), so reconciling them here would race it."""
    gone = {
        t.number
        for t in study.get_trials(deepcopy=False)
        if launcher_gone(t.user_attrs.get(OWNER), owner)
    }
    return [trial for trial in trials if trial.number in gone]


def running_elsewhere(study: Study, owner: str) -> bool:
    """Whether a trial another launcher follows (not ``owner``'s process) still runs: the
    last launcher to finish closes the parent run and draws the plots of the whole study."""
    from optuna.trial import TrialState

    process = _process(owner)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return any(_process(str(t.user_attrs.get(OWNER) or "")) != process for t in running)


def _process(owner: str) -> str:
    """``host:pid:start``, the process part of an owner (its token changes as it renews)."""
    return ":".join(owner.split(":")[:3])
