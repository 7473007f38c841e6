"""Which launcher follows which trial: launcher identities, heartbeats and atomic claims.

Several launchers, on one machine or many, may share a study.  Each has an identity,
``host:pid:start:token`` (``PAIEXP_LAUNCHER_HOST`` overrides the host part), and names itself
the owner (``paiexp:owner``) of every trial it follows.  It heartbeats with one write to the
study per interval (the study system attribute ``paiexp:heartbeat:<identity>``), however many
trials it follows.  An owner is gone when it ran on this host and its process is dead, or when
its heartbeat has not changed for the grace period as another launcher watched it (that
launcher's own clock: no clocks of two machines are compared).

Every change of owner is an atomic claim (:mod:`paiexp.sweep.claims`), so of two launchers
adopting one trial exactly one wins.  A launcher acts on its trials only while its last
heartbeat is less than half the grace period old; after a longer silence it claims its trials
again under a new token first, and leaves those another launcher took meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paiexp.errors import UserError
from paiexp.sweep.claims import create_claims
from paiexp.sweep.records import HEARTBEAT
from paiexp.util.processes import process_alive, process_start_time

if TYPE_CHECKING:
    from optuna import Study, Trial
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

HOST_ENV = "PAIEXP_LAUNCHER_HOST"


@dataclass(frozen=True)
class Identity:
    """A launcher: its host, process (pid and kernel start time) and a token of its own."""

    host: str
    pid: int
    start: str | None
    token: str | None

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}:{self.token}"

    def renewed(self) -> Identity:
        return dataclasses.replace(self, token=secrets.token_hex(4))


def this_host() -> str:
    """This machine's name among launchers: ``$PAIEXP_LAUNCHER_HOST`` if set, else its own."""
    host = os.environ.get(HOST_ENV) or socket.gethostname()
    if ":" in host:
        raise UserError(f"{HOST_ENV}: {host!r} must not contain ':'")
    return host


def launcher_identity() -> Identity:
    """This process's identity, with a new token."""
    pid = os.getpid()
    return Identity(this_host(), pid, process_start_time(pid), secrets.token_hex(4))


def parse_owner(owner: str) -> Identity | None:
    """The identity an owner attribute names (``host:pid:start[:token]``), if it is one."""
    host, _, rest = owner.partition(":")
    pid, _, rest = rest.partition(":")
    start, _, token = rest.partition(":")
    if not pid.isdigit():
        return None
    return Identity(host, int(pid), None if start in ("", "None") else start, token or None)


def dead_here(owner: str, host: str) -> bool | None:
    """For an owner that ran on ``host`` (this one): whether its process is gone; None for
    an owner on another host, whose process cannot be looked at."""
    identity = parse_owner(owner)
    if identity is None or identity.host != host:
        return None
    return not process_alive(identity.pid, identity.start)


def study_storage(study: Study) -> tuple[BaseStorage, int]:
    """The storage and id of an open study, for the system attributes Optuna 5 no longer
    sets through ``Study``: the one use of its private ``_storage`` and ``_study_id``."""
    return study._storage, study._study_id


def trial_id(trial: Trial | FrozenTrial) -> int:
    """A trial's id in its storage (claims and :func:`paiexp.sweep.resume.reopen` name it):
    the one use of Optuna's private ``_trial_id``."""
    return trial._trial_id


def heartbeat_interval(grace: float) -> float:
    """How often a launcher heartbeats, for a grace period of ``grace`` seconds."""
    return grace / 4


class Lease:
    """This launcher's hold on its trials: its identity, heartbeats and claims.

    Heartbeats come every quarter of ``grace``; :meth:`fresh` says whether the last began less
    than half of ``grace`` ago, so that no launcher can have found this one silent for all of
    it.  Measured from its start, a write that hung counts as silence.
    """

    def __init__(self, study: Study, location: str, identity: Identity, grace: float) -> None:
        self.storage, self.study_id = study_storage(study)
        self.claims = create_claims(self.storage, self.study_id, location)
        self.identity = identity
        self.grace = grace
        self.interval = heartbeat_interval(grace)
        self.last_beat = -float("inf")  # monotonic time the last heartbeat began

    @property
    def owner(self) -> str:
        return str(self.identity)

    def due(self) -> bool:
        return time.monotonic() - self.last_beat >= self.interval

    def fresh(self) -> bool:
        return time.monotonic() - self.last_beat < self.grace / 2

    def beat(self) -> None:
        started = time.monotonic()
        self.storage.set_study_system_attr(self.study_id, HEARTBEAT + self.owner, time.time())
        self.last_beat = started

    def renew(self, trial_ids: dict[int, int]) -> list[int]:
        """After a silence: a new token, a heartbeat, and each trial (number -> storage id)
        claimed again under it; returns the numbers of those another launcher took."""
        previous = self.owner
        self.identity = self.identity.renewed()
        self.beat()
        return [
            number
            for number, trial_id in trial_ids.items()
            if not self.claims.claim(trial_id, previous, self.owner)
        ]

    def claim(self, trial_id: int, expected: str | None) -> bool:
        return self.claims.claim(trial_id, expected, self.owner)

    def outages(self) -> int:
        """How many outages of the study's database server this launcher waited through."""
        from paiexp.sweep.patient_storage import outage_of

        outage = outage_of(self.storage)
        return 0 if outage is None else outage.ended

    def heartbeats(self) -> dict[str, Any]:
        """Every launcher's last heartbeat in this study, by owner."""
        return heartbeats(self.storage, self.study_id)


def heartbeats(storage: BaseStorage, study_id: int) -> dict[str, Any]:
    """Every launcher's last heartbeat in a study, by owner."""
    attrs = storage.get_study_system_attrs(study_id)
    return {k[len(HEARTBEAT) :]: v for k, v in attrs.items() if k.startswith(HEARTBEAT)}


class Watch:
    """Other launchers as this one has seen them: whether each is gone.

    A value (an owner's heartbeat, or None while a trial has no owner) is silent for the time
    since this launcher first saw it unchanged.
    """

    def __init__(self, identity: Identity, grace: float) -> None:
        self.host = identity.host
        self.grace = grace
        self.seen: dict[str, tuple[Any, float]] = {}  # key -> (value, when first seen)

    def restart(self) -> None:
        """Count every silence from now: after an outage of the study's storage, in which no
        launcher could write a heartbeat."""
        self.seen.clear()

    def silent(self, key: str, value: Any) -> bool:
        """Whether ``value`` under ``key`` stayed the same for the grace period."""
        now = time.monotonic()
        last = self.seen.get(key)
        if last is None or last[0] != value:
            self.seen[key] = (value, now)
            return False
        return now - last[1] >= self.grace

    def gone(self, owner: str, heartbeats: dict[str, Any]) -> bool:
        dead = dead_here(owner, self.host)
        if dead is not None:
            return dead
        return self.silent(owner, heartbeats.get(owner))
