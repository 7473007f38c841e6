"""What a person sees while a sweep runs, and the summary at its end (rich, on stderr)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from paiexp.redact import redact_url
from paiexp.sweep.records import RETRIED

if TYPE_CHECKING:
    from optuna import Study

    from paiexp.sweep.launcher import SweepOutcome
    from paiexp.sweep.study import Objective

TOP_TRIALS = 5


class RunningSweep(Protocol):
    """What the status line reads of a running sweep."""

    @property
    def study(self) -> Study: ...

    @property
    def running(self) -> int:
        """Trials whose jobs run now."""


class Progress:
    def __init__(
        self, n_trials: int, objectives: Sequence[Objective], console: Console | None = None
    ) -> None:
        # Not a terminal (CI, a log file): wide enough that tables keep their numbers.
        self.console = console or Console(stderr=True, width=None if sys.stderr.isatty() else 160)
        self.n_trials = n_trials
        self.objectives = list(objectives)
        self.counts = {"COMPLETE": 0, "FAIL": 0, "PRUNED": 0}
        self.best_text = "-"
        self.started_at = time.monotonic()
        self._sweep: RunningSweep | None = None
        self._live: Live | None = None

    @contextmanager
    def live(self, sweep: RunningSweep) -> Iterator[None]:
        """Show the status line, kept current, while the sweep runs."""
        self._sweep = sweep
        self._count_existing(sweep.study)
        with Live(
            self._status(), console=self.console, refresh_per_second=4, transient=True
        ) as live:
            self._live = live
            try:
                yield
            finally:
                self._live = None
        self.console.print(self._status())

    def _count_existing(self, study: Study) -> None:
        for trial in study.get_trials(deepcopy=False):
            if trial.state.name in self.counts and not trial.user_attrs.get(RETRIED):
                self.counts[trial.state.name] += 1
        self.best(study)

    def _status(self) -> Text:
        running = self._sweep.running if self._sweep else 0
        elapsed = time.monotonic() - self.started_at
        return Text.assemble(
            ("sweep ", "bold"),
            f"{self.counts['COMPLETE']}/{self.n_trials} complete · {running} running · ",
            (f"{self.counts['FAIL']} failed", "red" if self.counts["FAIL"] else ""),
            f" · {self.counts['PRUNED']} pruned · best {self.best_text} · ",
            f"{int(elapsed // 60):02d}:{elapsed % 60:04.1f}",
        )

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._status())

    def say(self, message: str) -> None:
        self.console.print(f"[paiexp] {message}", markup=False, highlight=False)

    def started(self, number: int) -> None:
        self.refresh()

    def finished(
        self, number: int, state: str, values: Sequence[float] | None, reason: str | None
    ) -> None:
        self.counts[state] = self.counts.get(state, 0) + 1
        shown = ""
        if values:
            shown = ", ".join(
                f"{o.metric}={v:.6g}" for o, v in zip(self.objectives, values, strict=True)
            )
        elif reason:
            shown = reason.splitlines()[0]
        style = {"COMPLETE": "green", "FAIL": "red", "PRUNED": "yellow"}.get(state, "")
        self.console.print(
            Text.assemble(f"trial {number:>4} ", (f"{state:<8}", style), f" {shown}")
        )
        self.refresh()

    def best(self, study: Study) -> None:
        from optuna.trial import TrialState

        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            return
        if len(self.objectives) == 1:
            best = study.best_trial
            self.best_text = f"{self.objectives[0].metric}={best.value:.6g} (trial {best.number})"
        else:
            self.best_text = f"{len(study.best_trials)} on the Pareto front"


def print_summary(
    console: Console,
    outcome: SweepOutcome,
    objectives: Sequence[Objective],
    storage: str,
    study_name: str,
) -> None:
    """Top trials, best parameters, and how to browse the results."""
    from optuna.trial import TrialState

    study = outcome.study
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if complete:
        if len(objectives) == 1:
            reverse = objectives[0].direction == "maximize"
            top = sorted(complete, key=lambda t: t.values[0], reverse=reverse)[:TOP_TRIALS]
        else:
            top = study.best_trials[:TOP_TRIALS]
        table = Table(title=f"top trials of study {study_name}")
        table.add_column("trial", justify="right")
        for objective in objectives:
            table.add_column(objective.metric, justify="right")
        names = sorted({name for trial in top for name in trial.params})
        for name in names:
            table.add_column(name, justify="right")
        for trial in top:
            table.add_row(
                str(trial.number),
                *(f"{v:.6g}" for v in trial.values),
                *(_short(trial.params.get(name)) for name in names),
            )
        console.print(table)
        if len(objectives) == 1:
            console.print(f"best params: {study.best_trial.params}")
    else:
        console.print("no trial completed")
    if outcome.stop_reason and not outcome.interrupted:
        console.print(f"[paiexp] stopped submitting: {outcome.stop_reason}", markup=False)
    if outcome.tracking_errors:
        console.print(
            f"[paiexp] {len(outcome.tracking_errors)} MLflow calls failed; the "
            "next launch of this sweep re-applies what is missing",
            markup=False,
        )
    if outcome.tracker_uri:
        console.print(
            f"browse runs:   mlflow ui --backend-store-uri {outcome.tracker_uri}", markup=False
        )
    console.print(f"browse study:  optuna-dashboard {redact_url(storage)}", markup=False)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
