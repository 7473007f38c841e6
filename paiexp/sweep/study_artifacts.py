"""A finished study as files for its parent run: every trial as CSV, plots as PNG."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def warm_up() -> None:
    """Import what the plots need (seconds), while trials run rather than after them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import optuna.importance
    import optuna.visualization.matplotlib  # noqa: F401


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
    import matplotlib

    matplotlib.use("Agg")
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    import matplotlib.pyplot as plt

    plot = optuna.visualization.matplotlib
    for index in range(len(study.directions)):
        multi = len(study.directions) > 1
        target = (lambda t, i=index: t.values[i]) if multi else None
        name = f"objective {index}" if multi else "Objective Value"
        suffix = f"_{index}" if multi else ""
        drawings: dict[str, Callable[..., Any]] = {
            f"optimization_history{suffix}": plot.plot_optimization_history
        }
        if len(complete) >= 2:
            drawings[f"param_importances{suffix}"] = plot.plot_param_importances
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
