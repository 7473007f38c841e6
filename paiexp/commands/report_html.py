"""A study as one self-contained HTML page: its summary, top trials and Optuna's plotly plots
(optimization history, parameter importances, parallel coordinates, slices, the Pareto front
of several objectives, and the timeline of trial states and durations), with plotly.js inline
once, so the file opens anywhere, offline, and as an MLflow artifact."""

from __future__ import annotations

import functools
import html
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from paiexp.sweep.progress import trial_rows
from paiexp.sweep.records import SWEEP_ID
from paiexp.sweep.spending import spent

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

    from paiexp.sweep.study import Objective

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } dl { display: grid; grid-template-columns: max-content auto; }
dt { font-weight: bold; padding-right: 1em; } dd { margin: 0; }
.skipped { color: #777; font-style: italic; } section { overflow-x: auto; }
"""


def render_report(
    study: Study,
    objectives: Sequence[Objective],
    best: Sequence[FrozenTrial],
    *,
    storage: str,
    parent_run_id: str | None,
) -> str:
    """The whole page."""
    from plotly.offline import get_plotlyjs

    sections = [_summary(study, objectives, storage, parent_run_id), _table(best, objectives)]
    for title, draw in plots(study, objectives):
        sections.append(_figure(title, draw))
    title = f"Sweep report: study {study.study_name}"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>",
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            f"</head><body><h1>{html.escape(title)}</h1>",
            *sections,
            "</body></html>",
        ]
    )


def plots(study: Study, objectives: Sequence[Objective]) -> list[tuple[str, Callable[[], Any]]]:
    """(title, a function drawing the plotly figure) of every plot, per objective."""
    import optuna.visualization as vis

    from paiexp.sweep.study_artifacts import import_importance

    import_importance()  # without scikit-learn: PED-ANOVA needs none
    from optuna.importance import PedAnovaImportanceEvaluator

    drawings: list[tuple[str, Callable[[], Any]]] = []
    multi = len(objectives) > 1
    for index, objective in enumerate(objectives):
        target = functools.partial(_value, index=index) if multi else None
        named: dict[str, Any] = {"target": target, "target_name": objective.metric}
        of = f" of {objective.metric}"
        importances = functools.partial(
            vis.plot_param_importances, study, evaluator=PedAnovaImportanceEvaluator(), **named
        )
        drawings += [
            (
                f"Optimization history{of}",
                functools.partial(vis.plot_optimization_history, study, **named),
            ),
            (f"Parameter importances (PED-ANOVA){of}", importances),
            (
                f"Parallel coordinates{of}",
                functools.partial(vis.plot_parallel_coordinate, study, **named),
            ),
            (f"Slices{of}", functools.partial(vis.plot_slice, study, **named)),
        ]
    if multi and len(objectives) <= 3:
        names = [o.metric for o in objectives]
        drawings.append(
            ("Pareto front", functools.partial(vis.plot_pareto_front, study, target_names=names))
        )
    drawings.append(("Trial states and durations", functools.partial(vis.plot_timeline, study)))
    return drawings


def _value(trial: FrozenTrial, index: int) -> float:
    return float(trial.values[index])


def _figure(title: str, draw: Callable[[], Any]) -> str:
    import optuna

    heading = f"<section><h2>{html.escape(title)}</h2>"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            figure = draw()
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:  # e.g. too few trials
            return f'{heading}<p class="skipped">not drawn: {html.escape(str(exc))}</p></section>'
    body = figure.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})
    return f"{heading}{body}</section>"


def _summary(
    study: Study, objectives: Sequence[Objective], storage: str, parent_run_id: str | None
) -> str:
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    durations = [t.duration.total_seconds() for t in trials if t.duration is not None]
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    items = {
        "study": study.study_name,
        "storage": storage,
        "objectives": ", ".join(f"{o.metric} ({o.direction})" for o in objectives),
        "sweep id": study.user_attrs.get(SWEEP_ID, "-"),
        "MLflow parent run": parent_run_id or "-",
        "trials": ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())) or "none",
        "trial durations": (
            f"median {statistics.median(durations):.1f} s, max {max(durations):.1f} s"
            if durations
            else "-"
        ),
        "wall time": (
            f"{(max(ends) - min(starts)).total_seconds():.1f} s" if starts and ends else "-"
        ),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    total = spent(trials)
    if total is not None:
        items["cost"] = total.text()
    if len(objectives) == 1 and states.get("COMPLETE"):
        best = study.best_trial
        items["best"] = f"{best.value:.6g} (trial {best.number})"
        items["best params"] = ", ".join(f"{k}={v}" for k, v in best.params.items())
    rows = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in items.items()
    )
    return f"<section><dl>{rows}</dl></section>"


def _table(best: Sequence[FrozenTrial], objectives: Sequence[Objective]) -> str:
    if not best:
        return "<section><h2>Top trials</h2><p>no trial completed yet</p></section>"
    header, rows = trial_rows(best, objectives)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<section><h2>Top trials</h2><table><tr>{head}</tr>{body}</table></section>"
