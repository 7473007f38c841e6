"""What a person sees while a sweep runs, and the summary at its end (rich, on stderr)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from paiexp.sweep.opening import PARENT_RUN_ATTR
from paiexp.sweep.records import JOB_NAME, PREEMPTED, REASON, RETRIED
from paiexp.sweep.spending import spent, trial_cost
from paiexp.tracking.browse import browse_lines, console_command
from paiexp.tracking.cost import RunCost
from paiexp.tracking.monitor import job_log
from paiexp.util.redact import redact_url

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

    from paiexp.sweep.prepared import SweepOutcome
    from paiexp.sweep.study import Objective
    from paiexp.sweep.tracking_messages import BestRun

TOP_TRIALS = 5
FAILURE_LOG_LINES = 10  # of the first failed trial's log, when no trial completed


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
        self.counts = TrialCounts()  # the ended trials (running ones: the sweep's own count)
        self.best_text = "-"
        self.spent: RunCost | None = None  # what the study's trials cost so far
        self.started_at = time.monotonic()
        self._sweep: RunningSweep | None = None
        self._live: Live | None = None

    @contextmanager
    def live(self, sweep: RunningSweep) -> Iterator[None]:
        """Show the status line, kept current, while the sweep runs."""
        self._sweep = sweep
        self._count_existing(sweep.study)
        with Live(
            self.status(), console=self.console, refresh_per_second=4, transient=True
        ) as live:
            self._live = live
            try:
                yield
            finally:
                self._live = None
        self.console.print(self.status())

    def _count_existing(self, study: Study) -> None:
        self.counts = dataclasses.replace(
            TrialCounts.of(study.get_trials(deepcopy=False)), running=0
        )
        self.spent = spent(study.get_trials(deepcopy=False))
        self.best(study)

    def status(self) -> Text:
        """The status line (see :func:`status_line`)."""
        running = self._sweep.running if self._sweep else 0
        elapsed = time.monotonic() - self.started_at
        cost = self.spent.text() if self.spent else None
        counts = dataclasses.replace(self.counts, running=running)
        return status_line(counts, self.n_trials, self.best_text, elapsed, cost)

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.status())

    def say(self, message: str) -> None:
        self.console.print(f"[paiexp] {message}", markup=False, highlight=False)

    def spend(self, cost: RunCost) -> None:
        """A trial's job cost this: the running total grows."""
        self.spent = cost if self.spent is None else self.spent + cost

    def started(self, number: int) -> None:
        self.refresh()

    def finished(
        self,
        number: int,
        state: str,
        values: Sequence[float] | None,
        reason: str | None,
        *,
        retried: bool = False,
        preempted: bool = False,
    ) -> None:
        """A trial ended; ``retried``: it failed and its point runs again (it counts no more);
        ``preempted``: so, because the platform took its job away (shown as PREEMPTED)."""
        self.counts.add(state, retried=retried, preempted=preempted)
        if preempted:
            state = "PREEMPTED"
        shown = ""
        if values:
            shown = ", ".join(
                f"{o.metric}={v:.6g}" for o, v in zip(self.objectives, values, strict=True)
            )
        elif reason:
            shown = reason.splitlines()[0]
        style = {"COMPLETE": "green", "FAIL": "red", "PRUNED": "yellow", "PREEMPTED": "yellow"}
        self.console.print(
            Text.assemble(f"trial {number:>4} ", (f"{state:<8}", style.get(state, "")), f" {shown}")
        )
        self.refresh()

    def best(self, study: Study) -> None:
        from optuna.trial import TrialState

        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if complete:
            self.show_best(best_of(study, self.objectives, complete))

    def show_best(self, best: Sequence[FrozenTrial]) -> None:
        """The best trial (one objective) or the Pareto front, as :func:`best_of` gives."""
        self.best_text = best_text(self.objectives, best)


@dataclass
class TrialCounts:
    """Trials by state, as the status line counts them: ``complete``, ``pruned`` and
    ``failed`` count toward n_trials; ``rerun`` are failed ones whose point runs again
    (``preempted`` of them: the platform took their jobs away); ``running``."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    rerun: int = 0
    preempted: int = 0
    running: int = 0

    def add(self, state: str, *, retried: bool = False, preempted: bool = False) -> None:
        """One trial more, in Optuna's ``state`` (COMPLETE, PRUNED, FAIL, RUNNING)."""
        if retried:
            self.rerun += 1
            self.preempted += preempted
        elif state in _FIELD_OF_STATE:
            field = _FIELD_OF_STATE[state]
            setattr(self, field, getattr(self, field) + 1)

    @classmethod
    def of(cls, trials: Iterable[FrozenTrial]) -> TrialCounts:
        """The counts of a study's ``trials``, as its ``paiexp:*`` attributes tell them."""
        counts = cls()
        for trial in trials:
            retried = bool(trial.user_attrs.get(RETRIED))
            preempted = bool(trial.user_attrs.get(PREEMPTED))
            counts.add(trial.state.name, retried=retried, preempted=preempted)
        return counts


_FIELD_OF_STATE = {
    "COMPLETE": "complete",
    "PRUNED": "pruned",
    "FAIL": "failed",
    "RUNNING": "running",
}


def status_line(
    counts: TrialCounts, n_trials: int | None, best: str, elapsed: float, cost: str | None = None
) -> Text:
    """The status line: trials done of n_trials (complete, pruned and failed ones alike),
    running, re-run (and preempted of those), the best so far, what the ended trials cost
    (``cost``) and the time taken."""
    done = counts.complete + counts.pruned + counts.failed
    of = f"/{n_trials}" if n_trials is not None else ""
    failed_text = (f", {counts.failed} failed", "red") if counts.failed else ""
    rerun_text = f" · {counts.rerun} re-run" if counts.rerun else ""
    if counts.rerun and counts.preempted:
        rerun_text += f" ({counts.preempted} preempted)"
    return Text.assemble(
        ("sweep ", "bold"),
        f"{done}{of} done ({counts.complete} complete, {counts.pruned} pruned",
        failed_text,
        f") · {counts.running} running{rerun_text} · best {best} · ",
        f"cost {cost} · " if cost else "",
        f"{int(elapsed // 60):02d}:{elapsed % 60:04.1f}",
    )


def best_text(objectives: Sequence[Objective], best: Sequence[FrozenTrial]) -> str:
    """The status line's best: the best trial's value (one objective), else the Pareto
    front's size."""
    if not best:
        return "-"
    if len(objectives) == 1:
        return f"{objectives[0].metric}={best[0].values[0]:.6g} (trial {best[0].number})"
    return f"{len(best)} on the Pareto front"


def best_of(
    study: Study, objectives: Sequence[Objective], complete: Sequence[FrozenTrial]
) -> list[FrozenTrial]:
    """The best of the ``complete`` trials (Optuna's first best of one objective, in one
    pass, without a copy), or the study's Pareto front."""
    if len(objectives) > 1:
        return study.best_trials
    return [min(complete, key=ranking(objectives[0]))]


def ranking(objective: Objective) -> Callable[[FrozenTrial], tuple[float, int]]:
    """The sort key of complete trials, best first; a tie goes to the earlier trial (so the
    status line, the summary and the parent run name the same one)."""
    return lambda trial: rank(objective, trial.values[0], trial.number)


def rank(objective: Objective, value: float, number: int) -> tuple[float, int]:
    """Trial ``number``'s place when it scores ``value``: lower ranks better."""
    return (-value if objective.direction == "maximize" else value, number)


def print_summary(
    console: Console,
    outcome: SweepOutcome,
    objectives: Sequence[Objective],
    storage: str,
    study_name: str,
    base_dir: Path,
) -> None:
    """Top trials, best parameters and where the best model is, or why no trial completed;
    and how to browse the results."""
    study = outcome.study
    top = top_trials(study, objectives)
    if top:
        console.print(trials_table(top, objectives, f"top trials of study {study_name}"))
        if len(objectives) == 1:
            params = " ".join(f"{k}={_param(v)}" for k, v in top[0].params.items())
            console.print(f"best params: {params}", markup=False, highlight=False)
    else:
        for line in ["no trial completed", *first_failure(study, base_dir)]:
            console.print(line, markup=False, highlight=False)
    if outcome.best is not None and len(objectives) == 1:
        for line in best_run_lines(outcome.best, top[0].number if top else None):
            console.print(line, markup=False, highlight=False)
    total = spent(study.get_trials(deepcopy=False))
    if total is not None:
        console.print(f"cost: {total.text()}", markup=False, highlight=False)
    if outcome.stop_reason and not outcome.interrupted:
        console.print(f"[paiexp] stopped submitting: {outcome.stop_reason}", markup=False)
    if outcome.tracking_errors:
        console.print(
            f"[paiexp] {len(outcome.tracking_errors)} MLflow calls failed; the "
            "next launch of this sweep re-applies what is missing",
            markup=False,
        )
    if outcome.tracker_uri:
        parent_run = study.user_attrs.get(PARENT_RUN_ATTR)
        for line in browse_lines(outcome.tracker_uri, outcome.experiment_id, parent_run):
            console.print(line, markup=False, highlight=False)
    if outcome.registered:
        console.print(f"registered:    {outcome.registered}", markup=False, highlight=False)
    if importlib.util.find_spec("optuna_dashboard") is not None:  # only a tool one has
        dashboard = console_command("optuna-dashboard")
        console.print(f"browse study:  {dashboard} {redact_url(storage)}", markup=False)


def best_run_lines(best: BestRun, number: int | None) -> list[str]:
    """Where the best trial's run and model are, and the command that fetches the model."""
    trial = f" (trial {number})" if number is not None else ""
    lines = [f"best run:      {best.run_id}{trial}"]
    if best.model_uri is None:
        return [*lines, "best model:    none (its job left no model)"]
    fetch = f"{console_command('paiexp')} download {best.run_id} ./model"
    return [*lines, f"best model:    {best.model_uri}", f"fetch it:      {fetch}"]


def first_failure(study: Study, base_dir: Path, lines: int = FAILURE_LOG_LINES) -> list[str]:
    """Why the study's first failed trial failed, and the last lines of its job's log (the
    script's own error), when this machine has them."""
    from optuna.trial import TrialState

    failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    if not failed:
        return []
    trial = failed[0]
    reason = str(trial.user_attrs.get(REASON) or "no reason recorded").splitlines()[0]
    said = [f"the first failure, trial {trial.number}: {reason}"]
    job = trial.user_attrs.get(JOB_NAME)
    log = job_log(base_dir, job) if job else None
    if log is None or not log.is_file():
        return said
    with log.open(errors="replace") as stream:
        tail = [line.rstrip() for line in deque(stream, maxlen=lines)]
    return [*said, f"  the last lines of its log ({_shown(log)}):", *(f"    {t}" for t in tail)]


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def top_trials(
    study: Study, objectives: Sequence[Objective], limit: int = TOP_TRIALS
) -> list[FrozenTrial]:
    """The best complete trials, best first (several objectives: the Pareto front)."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return []
    if len(objectives) > 1:
        return list(study.best_trials[:limit])
    return sorted(complete, key=ranking(objectives[0]))[:limit]


def trial_rows(
    trials: Sequence[FrozenTrial], objectives: Sequence[Objective]
) -> tuple[list[str], list[list[str]]]:
    """(column names, one row of text per trial): number, objective values, params."""
    names = sorted({name for trial in trials for name in trial.params})
    header = ["trial", *(o.metric for o in objectives), *names]
    rows = [
        [
            str(trial.number),
            *(f"{v:.6g}" for v in trial.values),
            *(_short(trial.params.get(name)) for name in names),
        ]
        for trial in trials
    ]
    costs = [trial_cost(trial) for trial in trials]
    if any(costs):  # what each trial's job cost (see paiexp.sweep.spending)
        currency = next((c.currency for c in costs if c and c.currency), None)
        header += ["instance-h", *([currency] if currency else [])]
        for row, cost in zip(rows, costs, strict=True):
            row.append(f"{cost.instance_hours:.3g}" if cost else "-")
            if currency:
                row.append(f"{cost.cost:.2f}" if cost and cost.cost is not None else "-")
    return header, rows


def trials_table(
    trials: Sequence[FrozenTrial], objectives: Sequence[Objective], title: str
) -> Table:
    header, rows = trial_rows(trials, objectives)
    table = Table(title=title)
    for name in header:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _param(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
