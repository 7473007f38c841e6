"""The tracking process of a sweep: applies the launcher's calls to MLflow, in order.

It dies with the launcher (a crash loses at most queued calls, which the next launch
reconciles), is out of reach of signals to the launcher's process group (Ctrl-C, timeout's
SIGTERM: an interrupted sweep still closes its runs), tells the launcher each call it is done
with (should it die, a new one is sent the calls not done again, :mod:`paiexp.sweep.tracking`),
applies each call as it comes (keeping up while trials run leaves the least for after the last
one), logs the plots the launcher drew meanwhile, and exits without the interpreter's
teardown.  Every MLflow call goes through :class:`paiexp.tracking.mlflow_tracker.MlflowTracker`.

A tracking server that stops answering is waited for (:mod:`paiexp.util.outage`, up to
``tracker.outage_timeout``): the call that failed is tried again, the calls behind it wait
in the queue in order, the trials go on.  Every call is idempotent when tried again: a run
it may have created is found by its job name, what it logs carries the time the launcher
sent it, a run already closed is left so.  MLflow's own client retries, which would resend a
request that reached the server, are turned off here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, assert_never

from paiexp.config.record import RunRecord, make_record
from paiexp.metrics.extraction import MetricPoint
from paiexp.sweep.opening import LEADER_ATTR, PARENT_RUN_ATTR
from paiexp.sweep.parent_run import running_elsewhere
from paiexp.sweep.records import JOB_NAME
from paiexp.sweep.spending import SPENT_HOURS, spent
from paiexp.sweep.study_artifacts import finished_trials, study_artifacts
from paiexp.sweep.tracking_messages import (
    BestRun,
    Call,
    CallFailed,
    Close,
    Closed,
    Done,
    FailChild,
    FinishChild,
    FinishedTrial,
    FinishParent,
    LogPoints,
    Notice,
    OpenParent,
    ParentOpened,
    Reconcile,
    Reply,
    Resumed,
    RunCreated,
    Sent,
    StartAndFinishChild,
    StartChild,
    TrackingSetup,
    TrialRecord,
    UpdateBest,
    call_name,
)
from paiexp.sweep.tracking_queue import CallQueue
from paiexp.tracking.cost import CURRENCY_TAG
from paiexp.tracking.mlflow_tracker import (
    BEST_MODEL_TAG,
    BEST_RUN_TAG,
    TERMINAL_RUN_STATUSES,
    TRIAL_STATE_TO_RUN_STATUS,
    tracking_uri,
    transient_tracking_error,
)
from paiexp.tracking.monitor import JobMonitor, job_log
from paiexp.tracking.sqlite_store import (
    create_new_store,
    leave_write_ahead,
    sqlite_file,
    write_ahead,
)
from paiexp.util.diskfull import DiskFull, disk_full, nearly_full
from paiexp.util.outage import Outage, OutageTooLong
from paiexp.util.redact import redact_url

if TYPE_CHECKING:
    from paiexp.backends import Backend
    from paiexp.sweep.claims import Claims
    from paiexp.tracking.mlflow_tracker import MlflowTracker

log = logging.getLogger(__name__)

Made = RunCreated | ParentOpened  # what a call opened, told to the launcher

# A launcher sharing a study waits this long for the leader's parent run, looking this often.
PARENT_WAIT_SECONDS = 120.0
PARENT_POLL_SECONDS = 0.5
# On the parent run: how many complete trials its best was taken from (a launcher sharing the
# study never overwrites a later view with an earlier one), and the best trial's job.
COMPLETE_TRIALS_TAG = "paiexp.complete_trials"
BEST_JOB_TAG = "paiexp.best_job"


def serve(calls: Any, connection: Connection, launcher_pid: int) -> None:
    """The tracking process: imports MLflow, takes the sweep's :class:`TrackingSetup`, then
    applies the launcher's calls in order until :class:`Close`, replying on ``connection``."""
    _die_with(launcher_pid)
    replies = Replies(connection)
    # Ctrl-C and a SIGTERM to the launcher's process group (timeout, a shell's kill) are the
    # launcher's to handle: it closes the runs through this process, which dies with it.  A
    # SIGTERM sent to this process itself still ends it (multiprocessing's at the command's
    # exit, for one it never used).
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"  # retried whole, idempotently, here
    loading = threading.Thread(target=load_mlflow, name="load-mlflow", daemon=True)
    loading.start()
    setup: TrackingSetup | Close = calls.get()
    if isinstance(setup, Close):  # the sweep was refused before it began
        replies.put(Closed(None))
        _exit(replies)
    with contextlib.suppress(OSError):  # the store's file at once (its first call says why not)
        create_new_store(tracking_uri(setup.tracker_uri))
    loading.join()
    quiet_about_full_disks(setup)
    worker = TrackingWorker(setup, lambda text: replies.put(Notice(text)))
    if setup.resumed is not None:
        worker.resume(setup.resumed)
    outage = tracking_outage(setup, lambda text: replies.put(Notice(text)))
    queued = CallQueue(calls)
    while True:
        message = queued.take()
        if isinstance(message, Sent):
            apply_sent(worker, message, outage, setup, replies)
            replies.put(Done(message.numbers))
            continue
        if isinstance(message, Close):
            replies.put(closed(worker))
            _exit(replies)


def closed(worker: TrackingWorker) -> Closed:
    """The last reply: where the runs are and the sweep's best (the store left in its
    rollback journal), or that MLflow never opened."""
    if not (worker.opened or worker.parent_run_id):
        return Closed(None)
    try:
        tracker = worker.tracker  # a replacement opens it here if no call did
    except Exception as exc:
        log.warning("MLflow did not open: %s", exc)
        return Closed(None)
    best = worker.best_run()
    leave_write_ahead(tracker.uri)
    return Closed(tracker.uri, tracker.experiment_id, worker.registered, best)


def apply_sent(
    worker: TrackingWorker, sent: Sent, outage: Outage, setup: TrackingSetup, replies: Replies
) -> None:
    """Apply one call the launcher sent, replying with the run it created or why it failed;
    once tracking has failed for good, calls are given up."""
    if worker.fatal:
        return
    try:
        created = apply_through_outages(worker, sent, outage)
    except Exception as exc:  # tracking must never take the sweep down
        text = f"{call_name(sent.call)}: {exc}"
        full = tracking_disk_full(setup, exc)
        if full is not None:  # the launcher stops; the next launch writes what is missing
            worker.fatal = text
            replies.put(CallFailed(text, True, full))
            return
        # nothing can be tracked without a parent run, nor while the server stays away
        fatal = not worker.parent_run_id or isinstance(exc, OutageTooLong)
        if fatal:
            worker.fatal = text
        else:
            log.warning("MLflow tracking call failed: %s", text)
        replies.put(CallFailed(text, fatal))
        return
    if created is not None:  # the launcher labels the trial's job with its run
        replies.put(created)


def load_mlflow() -> None:
    """Import the MLflow client, and its SQL store unless the tracking URI in the environment
    names a server: what the sweep's first call needs, loaded while the launcher starts."""
    from mlflow.tracking import MlflowClient  # noqa: F401

    if not os.environ.get("MLFLOW_TRACKING_URI", "").startswith(("http://", "https://")):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def tracking_disk_full(setup: TrackingSetup, exc: BaseException) -> DiskFull | None:
    """The full disk a call failed on, if it did: a SQLite store's own file unless the error
    names another (an artifact), with the traceback for the launcher's log of details."""
    database = sqlite_file(tracking_uri(setup.tracker_uri))
    path = None if database is None else str(database)
    return disk_full(exc, path, "".join(traceback.format_exception(exc)))


def quiet_about_full_disks(setup: TrackingSetup) -> None:
    """MLflow logs a database error with its whole dump before raising it, and each failed
    try to open the store: a full disk's are left to the launcher's one line and its log of
    details."""
    database = sqlite_file(tracking_uri(setup.tracker_uri))

    def not_disk_full(record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            return tracking_disk_full(setup, error) is None
        return database is None or not nearly_full(str(database.parent))

    logging.getLogger("mlflow.store.db.utils").addFilter(not_disk_full)


def tracking_outage(setup: TrackingSetup, notify: Callable[[str], None]) -> Outage:
    """How the tracking store's outages are ridden out (see :mod:`paiexp.util.outage`)."""
    from paiexp.tracking.mlflow_tracker import transient_tracking_error

    return Outage(
        service=f"MLflow tracking server at {redact_url(tracking_uri(setup.tracker_uri))}",
        key="tracker.outage_timeout",
        limit=setup.outage_timeout,
        transient=transient_tracking_error,
        notify=notify,
    )


def apply_through_outages(worker: TrackingWorker, sent: Sent, outage: Outage) -> Made | None:
    """Apply a call, tried again while the tracking store is down; each try after the first
    (and every try of a call sent again) knows it is a retry, and all are stamped with the
    time the launcher sent it."""
    tries = 0

    def attempt() -> Made | None:
        nonlocal tries
        tries += 1
        return worker.apply(sent.call, at=sent.at, retried=sent.again or tries > 1)

    return outage.call(attempt)


class Replies:
    """The replies to the launcher, sent in order by a thread of their own: the process never
    waits for the launcher to read them."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._waiting: queue.SimpleQueue[Reply | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send, name="replies", daemon=True)
        self._sender.start()

    def put(self, reply: Reply) -> None:
        self._waiting.put(reply)

    def _send(self) -> None:
        while (reply := self._waiting.get()) is not None:
            try:
                self._connection.send(reply)
            except OSError:  # the launcher is gone
                return

    def close(self) -> None:
        """Send what waits, then close the pipe."""
        self._waiting.put(None)
        self._sender.join()
        self._connection.close()


def _exit(replies: Replies) -> NoReturn:
    """End the process once the replies are written, skipping the interpreter's teardown of
    MLflow, SQLAlchemy, pandas... (most of a CPU-second, which the launcher would wait for).
    Every MLflow write is committed when its call returns."""
    replies.close()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _die_with(launcher_pid: int) -> None:
    """Be killed with the launcher (Linux), as a thread would be: a launcher killed with
    SIGKILL must not leave this process writing runs the next launch also writes."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != launcher_pid:
        os._exit(0)


class TrackingWorker:
    """The sweep's runs in MLflow: a parent run per study, a child run per trial."""

    def __init__(self, setup: TrackingSetup, notify: Callable[[str], None] = log.warning) -> None:
        """``notify``: tells the user what the tracking has to say."""
        self.setup = setup
        self.notify = notify
        self.fatal: str | None = None
        self.parent_run_id = ""
        self.runs: dict[str, str] = {}  # job name -> run id
        self.inherited: set[str] = set()  # job names whose runs existed before this launcher's
        self.fresh: dict[str, RunRecord] = {}  # job name -> record, of the new runs made here
        self.live: dict[str, dict[str, MetricPoint]] = {}  # job name -> last point logged live
        self.held: dict[str, dict[str, set[int]]] = {}  # inherited run id -> steps it holds
        self._best_job: str | None = None
        self.registered: str | None = None  # what sweep.register did
        self._tracker: MlflowTracker | None = None
        self._backend: Backend | None = None
        self._study: Any = None
        self._claims: Claims | None = None

    @property
    def claims(self) -> Claims:
        """The study's exclusive step, taken in turn with its launchers."""
        if self._claims is None:
            from paiexp.sweep.claims import create_claims
            from paiexp.sweep.ownership import study_storage

            storage, study_id = study_storage(self.study)
            self._claims = create_claims(storage, study_id, self.setup.storage)
        return self._claims

    @property
    def opened(self) -> bool:
        return self._tracker is not None

    @property
    def tracker(self) -> MlflowTracker:
        if self._tracker is None:
            from paiexp.tracking.mlflow_tracker import MlflowTracker

            setup = self.setup  # the launcher checked the server before the sweep began
            write_ahead(tracking_uri(setup.tracker_uri))
            self._tracker = MlflowTracker(setup.tracker_uri, setup.experiment, check_server=False)
        return self._tracker

    @property
    def backend(self) -> Backend:
        """The sweep's backend, to read what finished jobs left."""
        if self._backend is None:
            from paiexp.backends import create_backend

            self._backend = create_backend(self.setup.backend, self.setup.base_dir)
        return self._backend

    @property
    def study(self) -> Any:
        if self._study is None:
            import optuna

            from paiexp.sweep.study import create_storage, storage_outage

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            setup = self.setup
            # its outages are waited through quietly: the launcher tells the user of them
            outage = storage_outage(setup.storage, setup.storage_outage_timeout, log.debug)
            self._study = optuna.load_study(
                study_name=setup.study_name, storage=create_storage(setup.storage, outage)
            )
        return self._study

    def resume(self, resumed: Resumed) -> None:
        """Take over from a tracking process that died: its parent run and the trials' runs
        it made, which may hold part of what their calls, sent again, log."""
        self.parent_run_id = resumed.parent_run_id or ""
        self.runs.update(resumed.runs)
        self.inherited.update(resumed.runs)

    def apply(self, call: Call, *, at: float | None = None, retried: bool = False) -> Made | None:
        """Carry out one call; the run it opened, if any (the parent, a trial's).  ``at``: when the
        call was first tried (what it logs is stamped so; default now); ``retried``: an
        earlier try failed part way, so what it creates may exist already."""
        at = time.time() if at is None else at
        match call:
            case OpenParent():
                return ParentOpened(self.open_parent(call))
            case Reconcile():
                self.reconcile(call.trials, at=at)
            case StartChild():
                return RunCreated(call.job_name, self.start_child(call, retried=retried))
            case FinishChild():
                self.finish_child(call, at=at, retried=retried)
            case LogPoints():
                self.log_points(call)
            case StartAndFinishChild(start=start, finish=finish):
                if retried:  # part of it may be done: each half finds what is
                    run_id = self.start_child(start, retried=True)
                    self.finish_child(finish, at=at, retried=True)
                else:
                    run_id = self.start_and_finish_child(start, finish, at=at)
                return RunCreated(start.job_name, run_id)
            case FailChild():
                self.tracker.fail(self.runs[call.job_name], call.reason)
            case UpdateBest():
                self.update_best(call, at=at)
            case FinishParent():
                self.finish_parent(call)
            case _:
                assert_never(call)
        return None

    # -- parent ----------------------------------------------------------------------------

    def open_parent(self, call: OpenParent) -> str:
        """Find or create the study's parent run and mark it RUNNING again.

        Launchers sharing a study share its parent run.  The leader (the launcher that chose
        the sweep id) creates it; the others find it, waiting for the leader's when the study
        names none yet.  When the study names one this tracking store lacks (a new
        ``tracker.uri``), whoever comes creates it, the oldest kept.
        """
        run_id = self.tracker.sweep_run(call.known_run_id, call.sweep_id)
        run_id = run_id or self.tracker.find_sweep_run(call.sweep_id)
        if run_id is None and not call.leader and call.known_run_id is None:
            run_id = self.wait_for_parent(call.sweep_id)
        if run_id is None:
            run_id = self.tracker.create_sweep_run(
                call.sweep_id,
                run_name=call.new.run_name,
                tags=call.new.tags,
                params=call.new.params,
            )
        if run_id != call.known_run_id:
            self.study.set_user_attr(PARENT_RUN_ATTR, run_id)
        self.tracker.set_status(run_id, "RUNNING")
        self.tracker.set_tags(run_id, call.invocation)
        self.parent_run_id = run_id
        return run_id

    def wait_for_parent(self, sweep_id: str) -> str | None:
        """The leader's parent run, once it exists; None when the leader is gone before
        making it (as launchers find one another gone: silent for ``sweep.heartbeat_grace``,
        or dead on this host), or after :data:`PARENT_WAIT_SECONDS`."""
        from paiexp.sweep.ownership import Watch, heartbeats, launcher_identity, study_storage

        watch = Watch(launcher_identity(), self.setup.heartbeat_grace)
        deadline = time.monotonic() + PARENT_WAIT_SECONDS
        while time.monotonic() < deadline:
            time.sleep(PARENT_POLL_SECONDS)
            run_id = self.tracker.find_sweep_run(sweep_id)
            if run_id is not None:
                return run_id
            leader = self.study.user_attrs.get(LEADER_ATTR)
            if leader and watch.gone(leader, heartbeats(*study_storage(self.study))):
                log.warning(
                    "sweep %s: its leader %s is gone: creating its parent run", sweep_id, leader
                )
                return None
        log.warning(
            "no parent run of sweep %s after %g s: creating one", sweep_id, PARENT_WAIT_SECONDS
        )
        return None

    def update_best(self, call: UpdateBest, *, at: float) -> None:
        """The study's best on the parent run, and the best trial's run tagged.

        Launchers sharing the study each publish their view of it: an earlier view (fewer
        complete trials) than the parent's adds only its metric steps, and tags the run of the
        parent's best, which may not have existed when that view was published.
        """
        points = [MetricPoint(name, value, call.step, at) for name, value in call.metrics.items()]
        parent = self.tracker.get_run(self.parent_run_id)
        tags = parent.tags if parent else {}
        published = int(tags.get(COMPLETE_TRIALS_TAG, -1))
        if call.step < published:  # that step may be there (another launcher's, or launch's)
            self.tracker.log_metrics(self.parent_run_id, points, resumed=True)
            best_job = tags.get(BEST_JOB_TAG)
        else:
            view = {**call.tags, COMPLETE_TRIALS_TAG: str(call.step), BEST_JOB_TAG: call.best_job}
            resumed = call.step == published  # the same view, published before
            self.tracker.log_metrics(self.parent_run_id, points, tags=view, resumed=resumed)
            best_job = call.best_job
        if best_job is None or best_job == self._best_job:
            return
        best_run_id = self.runs.get(best_job)
        if best_run_id is None:  # another launcher's trial
            best = self.tracker.child_run(self.parent_run_id, best_job)
            best_run_id = best.run_id if best else None
        if best_run_id is not None:
            self.tracker.tag_best(self.parent_run_id, best_run_id)
            self._best_job = best_job

    def finish_parent(self, call: FinishParent) -> None:
        """Plots and the trials table as artifacts (the launcher's, unless trials ended since
        it drew them); then close the parent run.

        An interrupted launch closes it KILLED at once; the next full launch draws the plots.
        While a trial of another launcher than ``call.launcher`` runs, the last launcher does
        it all.
        """
        if call.launcher is not None and running_elsewhere(self.study, call.launcher):
            return
        self.log_totals()
        if not call.interrupted:
            with tempfile.TemporaryDirectory() as directory:
                drawn = call.drawn
                if drawn is not None and drawn.finished == finished_trials(self.study):
                    artifacts = list(drawn.files)
                else:
                    artifacts = study_artifacts(self.study, Path(directory))
                for artifact_dir, path in artifacts:
                    self.tracker.log_artifact(self.parent_run_id, path, artifact_dir)
            if self.setup.register:
                self.register_best(self.setup.register)
        complete = "FINISHED" if self.any_complete() else "FAILED"
        status = "KILLED" if call.interrupted else complete
        self.tracker.terminate(self.parent_run_id, status)

    def log_totals(self) -> None:
        """What the study's trials cost in all (see paiexp.sweep.spending), on the parent."""
        trials = self.study.get_trials(deepcopy=False)
        total = spent(trials)
        if total is None:
            return
        step = sum(1 for t in trials if SPENT_HOURS in t.user_attrs)  # a later launch's is new
        points = [MetricPoint(k, v, step, time.time()) for k, v in total.metrics().items()]
        tags = {CURRENCY_TAG: total.currency} if total.currency else {}
        self.tracker.log_metrics(self.parent_run_id, points, tags=tags, resumed=True)

    def any_complete(self) -> bool:
        """Whether a trial of the study completed (a sweep without one failed)."""
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def best_run(self) -> BestRun | None:
        """The best trial's run and model, as the parent run names them (None when tracking
        failed or no trial completed)."""
        if self.fatal or not self.parent_run_id:
            return None
        try:
            parent = self.tracker.get_run(self.parent_run_id)
        except Exception:  # the summary goes without it
            return None
        run_id = parent.tags.get(BEST_RUN_TAG) if parent else None
        if parent is None or not run_id:
            return None
        model_uri = parent.tags.get(BEST_MODEL_TAG)
        return BestRun(run_id, None if model_uri in (None, "-") else model_uri)

    def register_best(self, name: str) -> None:
        """The best trial's model as a version of the registered model ``name``; the alias
        ``best`` moves to it only if it beats the value the current ``best`` carries."""
        from paiexp.tracking.models import Candidate

        study = self.study
        try:
            trial = study.best_trial
        except ValueError:  # no complete trial
            log.warning("sweep.register: no complete trial, nothing registered in %s", name)
            return
        job_name = trial.user_attrs.get(JOB_NAME)
        run = self.tracker.child_run(self.parent_run_id, job_name) if job_name else None
        model_id = self.tracker.run_model(run.run_id) if run else None
        if run is None or model_id is None:
            log.warning("sweep.register: trial %d left no model to register", trial.number)
            return
        candidate = Candidate(
            run_id=run.run_id,
            model_id=model_id,
            model_uri=self.tracker.model_uri(model_id),
            value=float(trial.value),
            direction=study.direction.name.lower(),
            study=self.setup.study_name,
            trial=trial.number,
            metric=self.setup.objective,
        )
        registered = self.tracker.register(name, candidate)
        best = f"best stays version {registered.best_version}"
        self.registered = (
            f"{name} version {registered.version} ({'best' if registered.best else best})"
        )
        self.tracker.set_tags(self.parent_run_id, {"paiexp.registered": self.registered})

    # -- children --------------------------------------------------------------------------

    def start_child(self, call: StartChild, *, retried: bool = False) -> str:
        """Create a trial's run and log its record.  An adopted trial's run may exist, and so
        may a retried call's: either is found and reused.  In a shared study, a launcher may
        adopt the trial while this call waits in the queue (this launcher stalled): both keep
        the run recorded first in the study (:meth:`shared_child`)."""
        record = self.record(call.record)
        maybe_made = call.adopted or retried
        run_name = call.tags.get("mlflow.runName", call.job_name)
        if maybe_made or call.shared or self.followed_by_others():
            run_id, existed = self.shared_child(call.job_name, record, run_name, call.tags)
            if existed and maybe_made:
                self.inherited.add(call.job_name)
        else:  # surely this launcher's own new run
            run_id = self.create_child(record, run_name, call.tags)
            self.fresh[call.job_name] = record
        self.runs[call.job_name] = run_id
        self.tracker.log_record(run_id, record)
        return run_id

    def start_and_finish_child(self, start: StartChild, finish: FinishChild, *, at: float) -> str:
        """A trial whose job ended before its run was made, as one run made whole: created,
        then its record and what its job left logged together, and closed."""
        record = self.record(start.record)
        run_name = start.tags.get("mlflow.runName", start.job_name)
        run_id = self.create_child(record, run_name, start.tags)
        self.runs[start.job_name] = run_id
        self.log_finish(run_id, finish, at=at, record=record, log_record=True)
        return run_id

    def finish_child(self, call: FinishChild, *, at: float, retried: bool = False) -> None:
        """Log what a trial's job left and close its run; a retried call whose run got closed
        (the last step) has nothing left to do.  A retried call, or a run another launcher
        had, may hold some of it already: that is not logged twice."""
        run_id = self.runs[call.job_name]
        run = self.tracker.get_run(run_id) if retried else None
        if run is None or run.status not in TERMINAL_RUN_STATUSES:
            resumed = retried or call.job_name in self.inherited
            record = self.fresh.pop(call.job_name, None)
            live = tuple(self.live.pop(call.job_name, {}).values())
            if record is not None and live:  # its model links each metric's last point
                call = replace(call, unlogged=call.unlogged + live)
            self.log_finish(run_id, call, at=at, resumed=resumed, record=record)

    def log_points(self, call: LogPoints) -> None:
        """Running trials' new points on their runs, one round trip each; a run that refuses
        them (deleted meanwhile) costs the other trials none of theirs.

        Tried again whole (in an outage, or sent again to a new tracking process), a call logs
        no point twice: each point carries the time the launcher read it, and MLflow's SQL
        store (a tracking server's too) keeps one row per run, metric, timestamp, step and
        value (the ``metric_pk`` key), an equal row logged again being skipped
        (``SqlAlchemyStore._log_metrics_once``).  A run this process did not make (adopted, or
        a dead tracking process's) may hold the same steps at other times, read before from
        the same log: its steps held are read once and left out, as at its finish.
        """
        refused: list[Exception] = []
        for job_name, points in call.points.items():
            try:
                self.log_trial_points(job_name, points)
            except Exception as exc:
                if transient_tracking_error(exc):
                    raise  # the whole call is tried again once the store is back
                refused.append(exc)
        if refused:
            raise refused[0]

    def log_trial_points(self, job_name: str, points: Sequence[MetricPoint]) -> None:
        run_id = self.runs[job_name]
        held = self.held_steps(run_id, points) if job_name in self.inherited else None
        if held is not None:
            points = [p for p in points if p.step not in held[p.name]]
        self.tracker.log_metrics(run_id, points)
        for point in points:
            if held is not None:
                held[point.name].add(point.step)
            elif job_name in self.fresh:
                self.live.setdefault(job_name, {})[point.name] = point

    def held_steps(self, run_id: str, points: Sequence[MetricPoint]) -> dict[str, set[int]]:
        """The steps of each metric of ``points`` a run holds: read once, then kept."""
        held = self.held.setdefault(run_id, {})
        held.update(self.tracker.logged_steps(run_id, {p.name for p in points} - held.keys()))
        return held

    def log_finish(self, run_id: str, call: FinishChild, *, at: float, **options: Any) -> None:
        """What a trial's job left, on its run, what it logged with MLflow itself merged in
        (``options``: see :meth:`MlflowTracker.finish`); what the merge says, told."""
        result = dataclasses.replace(call.result, warnings=list(call.result.warnings))
        with tempfile.TemporaryDirectory(prefix="paiexp-mlflow-") as scratch:
            self.tracker.finish(
                run_id,
                result,
                unlogged=call.unlogged,
                status=call.status,
                reason=call.reason,
                extra_tags=call.tags,
                logged_at=at,
                own_store=self.backend.own_mlflow_store(result.handle, Path(scratch)),
                **options,
            )
        for line in result.warnings[len(call.result.warnings) :]:
            self.notify(line)

    def reconcile(self, trials: Iterable[FinishedTrial], *, at: float) -> None:
        """Give each trial that had finished before this launch a closed run: a crash may
        have dropped the calls that were queued for it."""
        children = self.tracker.child_runs(self.parent_run_id)
        backend = self.backend
        for trial in trials:
            child = children.get(trial.job_name)
            if child is not None and child.status in TERMINAL_RUN_STATUSES:
                continue
            if child is None:
                record = self.record(trial.record)
                run_name = f"trial-{trial.number}"
                run_id, _ = self.shared_child(trial.job_name, record, run_name, trial.tags)
                self.tracker.log_record(run_id, record)
            else:
                run_id = child.run_id
            self.runs[trial.job_name] = run_id
            handle = backend.find(trial.job_name)
            if handle is None:
                self.tracker.fail(run_id, trial.reason or "the job was never submitted")
                continue
            spec = trial.record.spec
            log_path = job_log(self.setup.base_dir, trial.job_name)
            monitor = JobMonitor(backend, handle, spec, log_path)
            job_status = backend.poll([handle])[handle.id]
            monitor.pull(final=True)
            result = monitor.result(job_status)
            result.cost = trial.cost
            with tempfile.TemporaryDirectory(prefix="paiexp-mlflow-") as scratch:
                self.tracker.finish(
                    run_id,
                    result,
                    unlogged=monitor.take_unlogged(),
                    status=TRIAL_STATE_TO_RUN_STATUS[trial.state],
                    reason=trial.reason,
                    extra_tags={"paiexp.trial_state": trial.state},
                    logged_at=at,
                    resumed=child is not None,
                    own_store=backend.own_mlflow_store(handle, Path(scratch)),
                )

    def followed_by_others(self) -> bool:
        """Whether other launchers have followed the study (their heartbeats are in it), as
        read now: one may have adopted a trial since this launcher sent its call."""
        from paiexp.sweep.ownership import heartbeats, study_storage

        return any(owner != self.setup.launcher for owner in heartbeats(*study_storage(self.study)))

    def shared_child(
        self, job_name: str, record: RunRecord, run_name: str, tags: dict[str, str]
    ) -> tuple[str, bool]:
        """The run of a trial another launcher may make too (adopted, retried, reconciled or
        in a shared study), and whether it existed: found, else made, then the one recorded
        first in the study kept (:mod:`paiexp.sweep.run_election`; a run made here that came
        second is deleted).  Where the study's exclusive step cannot be had, the oldest."""
        from paiexp.sweep.ownership import study_storage
        from paiexp.sweep.run_election import elect

        existing = self.tracker.child_run(self.parent_run_id, job_name)
        if existing is not None:
            candidate = existing.run_id
        else:
            candidate = self.create_child(record, run_name, tags)
        storage, study_id = study_storage(self.study)
        identity = f"{self.parent_run_id}:{job_name}"
        winner = elect(self.claims, storage, study_id, identity, candidate)
        if existing is not None:
            return winner or candidate, True
        if winner is None:
            return self.tracker.resolve_child(candidate, self.parent_run_id, job_name), False
        if winner != candidate:
            self.tracker.delete_run(candidate)
        return winner, False

    def create_child(self, record: RunRecord, run_name: str, tags: dict[str, str]) -> str:
        """A new run for a trial, under the parent run."""
        return self.tracker.create_child_run(
            record, run_name=run_name, parent_run_id=self.parent_run_id, extra_tags=tags
        )

    def record(self, record: TrialRecord) -> RunRecord:
        return make_record(
            record.data,
            record.spec,
            project_dir=self.setup.base_dir,
            overrides=self.setup.overrides,
            source=self.setup.source,
        )
