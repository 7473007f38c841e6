"""A finished study as files for its parent run: every trial as CSV, plots as PNG."""

from __future__ import annotations

import functools
import importlib.abc
import logging
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def load_when(ready: threading.Event) -> None:
    """Once ``ready`` is set, import what the trials table and the plots need (half a
    CPU-second): a launcher's thread, so that the sweep's end draws them at once."""
    ready.wait()
    import pandas  # noqa: F401  (the trials table)

    _plot_modules()


def _plot_modules() -> tuple[Any, Any]:
    """``matplotlib.pyplot`` (Agg) and ``optuna.visualization.matplotlib``, with
    ``optuna.importance`` imported without scikit-learn (:func:`import_importance`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import_importance()
    import optuna.visualization.matplotlib as plot

    return plt, plot


class _NoScikitLearn(importlib.abc.MetaPathFinder):
    """Refuses ``sklearn`` and its submodules to the thread that installed it, and only to
    imports not done already: other threads, and the modules in ``sys.modules``, see no
    difference, and nothing of the refusal stays once it is removed."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if threading.get_ident() == self.thread and name.partition(".")[0] == "sklearn":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def import_importance() -> None:
    """Import ``optuna.importance`` without scikit-learn, unless it is imported already.

    Its package imports the fANOVA and mean-decrease-impurity evaluators, which import
    ``sklearn.ensemble`` (over a CPU-second, with SciPy's statistics) at once, deferring an
    ImportError to their use; importing PED-ANOVA's module directly still runs that package
    first.  paiexp uses PED-ANOVA only (Optuna's default, NumPy only), so scikit-learn is
    refused to this one import, on this thread.
    """
    if "optuna.importance" in sys.modules:
        return
    refusal = _NoScikitLearn()
    sys.meta_path.insert(0, refusal)
    try:
        import optuna.importance  # noqa: F401
    finally:
        sys.meta_path.remove(refusal)


def finished_trials(study: Any) -> int:
    """How many of the study's trials have ended (the artifacts show them)."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished())


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
                with warnings.catch_warnings():  # e.g. PED-ANOVA's of equal importances
                    warnings.simplefilter("ignore")
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
