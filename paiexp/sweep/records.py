"""What a sweep records in the study storage: the ``paiexp:*`` attributes and job names.

Per trial (user attributes): ``paiexp:job_name``, deterministic from the study and the trial
number, before anything exists outside the storage; ``paiexp:job_id`` once its job is
submitted; ``paiexp:owner``, the launcher following it (changed only by an atomic claim, see
:mod:`paiexp.sweep.ownership`); and, when it ended, why it failed and whether it was re-run;
a re-run trial, its earlier attempts (job, reason, time lost) and the checkpoints it starts
from.
Per study: ``paiexp:sweep_id``, which tells its runs and jobs apart from those of another
study of the same name; and, as system attributes, ``paiexp:heartbeat:<owner>``, the time of
each launcher's last heartbeat, and on a database server ``paiexp:lock``, which launchers
lock in turn.
"""

from __future__ import annotations

JOB_NAME = "paiexp:job_name"
JOB_ID = "paiexp:job_id"
OWNER = "paiexp:owner"
REASON = "paiexp:failure_reason"
RETRIED = "paiexp:retried"
RETRY_OF = "paiexp:retry_of"
PREEMPTED = "paiexp:preempted"  # a re-run failure whose job the platform took away
ATTEMPT = "paiexp:attempt"
ATTEMPTS = "paiexp:attempts"  # a re-run trial's earlier attempts: [{job, reason, seconds}]
CHECKPOINTS = "paiexp:checkpoints"  # the checkpoints a re-run trial's job starts from
PRUNING = "paiexp:pruning"
SWEEP_ID = "paiexp:sweep_id"
HEARTBEAT = "paiexp:heartbeat:"  # + the owner
LOCK = "paiexp:lock"  # the row launchers lock in turn (paiexp.sweep.claims)
RUN = "paiexp:run:"  # + parent run id:job name, a trial's run (paiexp.sweep.run_election)

REASON_LIMIT = 2000  # characters of a failure reason kept in the storage


def job_name(study_name: str, sweep_id: str, number: int) -> str:
    """The deterministic name of a trial's job: a slug of the study, its sweep id, the trial."""
    slug = "".join(c if c.isalnum() else "-" for c in study_name.lower()).strip("-")
    slug = (slug or "sweep")[:24].rstrip("-")
    if not slug[0].isalpha():
        slug = f"s{slug}"[:24]
    return f"{slug}-{sweep_id[:6]}-t{number:04d}"
