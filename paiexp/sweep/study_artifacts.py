"""A finished study as files for its parent run: every trial as CSV, plots as PNG."""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def warm_up() -> None:
    """Import what the plots need (most of a second), ahead of the end of the sweep."""
    _plot_modules()


def _plot_modules() -> tuple[Any, Any]:
    """``matplotlib.pyplot`` (Agg) and ``optuna.visualization.matplotlib``.

    ``optuna.importance`` imports scikit-learn (over a CPU-second, with SciPy's statistics)
    for its fANOVA and mean-decrease-impurity evaluators only; the importances plot uses
    PED-ANOVA (NumPy only), so Optuna is imported with scikit-learn unavailable, when nothing
    imported it before.  Optuna defers that ImportError to those evaluators' use.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocked = "sklearn.ensemble" not in sys.modules
    if blocked:
        sys.modules["sklearn.ensemble"] = None  # type: ignore[assignment]  # ImportError
    try:
        import optuna.importance  # noqa: F401  (here, while scikit-learn is unavailable)
        import optuna.visualization.matplotlib as plot
    finally:
        if blocked and sys.modules.get("sklearn.ensemble") is None:
            sys.modules.pop("sklearn.ensemble", None)
    return plt, plot


def study_artifacts(study: Any, directory: Path) -> list[tuple[str, Path]]:
    """(artifact dir, file): every trial as CSV; optimization history and importances as PNG."""
    import optuna
    from optuna.trial import TrialState

    trials_csv = directory / "trials.csv"
    study.trials_dataframe().to_csv(trials_csv, index=False)
    artifacts = [("study", trials_csv)]
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return artifacts
    plt, plot = _plot_modules()
    from optuna.importance import PedAnovaImportanceEvaluator

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for index in range(len(study.directions)):
        multi = len(study.directions) > 1
        target = (lambda t, i=index: t.values[i]) if multi else None
        name = f"objective {index}" if multi else "Objective Value"
        suffix = f"_{index}" if multi else ""
        drawings: dict[str, Callable[..., Any]] = {
            f"optimization_history{suffix}": plot.plot_optimization_history
        }
        if len(complete) >= 2:  # Optuna's default evaluator, named: it needs no scikit-learn
            drawings[f"param_importances{suffix}"] = functools.partial(
                plot.plot_param_importances, evaluator=PedAnovaImportanceEvaluator()
            )
        for stem, draw in drawings.items():
            try:
                axes = draw(study, target=target, target_name=name)
            except (ValueError, RuntimeError) as exc:  # e.g. importances of a constant objective
                log.info("skipping plot %s: %s", stem, exc)
                continue
            figure = axes.get_figure(root=True)
            assert figure is not None
            figure.set_size_inches(9, 6)
            figure.tight_layout()
            path = directory / f"{stem}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            artifacts.append(("plots", path))
    return artifacts
