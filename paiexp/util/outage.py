"""Riding out an outage of a service a sweep depends on: its tracking server, its study's
database.

A call that fails with a transient error (no answer, or an answer that says "try again") is
retried with capped, jittered backoff until it succeeds or the service has been down for the
limit its config key sets; an outage is one span from the first failure to the next success,
however many calls wait through it.  The user hears of it once when it lasts, and once when
the service is back.  Retried calls must be idempotent: callers make them so.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from paiexp.util.retry import RetryPolicy

T = TypeVar("T")
OUTAGE_BACKOFF = RetryPolicy(base_delay=0.5, max_delay=10.0)  # its delays (no attempt limit)


class OutageTooLong(Exception):
    """The service stayed down longer than its limit; the text names the config key."""


@dataclass
class Outage:
    """The outages of one service: ``service`` names it to the user ("MLflow tracking server
    at http://..."), ``key`` is the config key of ``limit`` (seconds)."""

    service: str
    key: str
    limit: float
    transient: Callable[[BaseException], bool]
    notify: Callable[[str], None]
    sleep: Callable[[float], None] = time.sleep
    backoff: RetryPolicy = OUTAGE_BACKOFF
    down_since: float | None = None  # monotonic time of the first failure of this outage
    announced: bool = field(default=False)
    ended: int = 0  # how many outages ended (a call succeeded after failing)

    def call(self, attempt: Callable[[], T]) -> T:
        """``attempt()`` until it returns; raises its error when that is not transient, and
        :class:`OutageTooLong` once the service has been down for ``limit`` seconds."""
        retry = 0
        while True:
            try:
                result = attempt()
            except Exception as exc:
                if not self.transient(exc):
                    raise
                self._failed(exc, retry)
                self.sleep(self.backoff.delay(retry))
                retry += 1
                continue
            self._answered()
            return result

    def _failed(self, exc: BaseException, retry: int) -> None:
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
        down = now - self.down_since
        if down > self.limit:
            self.down_since, self.announced = None, False
            raise OutageTooLong(
                f"{self.key}: the {self.service} has not answered for {down:.0f} s "
                f"(limit {self.limit:g} s): {describe(exc)}"
            ) from exc
        if retry >= 1 and not self.announced:  # a blip that one retry rode out stays quiet
            self.announced = True
            self.notify(
                f"{self.service} is not answering ({describe(exc)}); retrying for up to "
                f"{self.limit:g} s ({self.key}), nothing is lost meanwhile"
            )

    def _answered(self) -> None:
        if self.down_since is None:
            return
        if self.announced:
            self.notify(f"{self.service} is back after {time.monotonic() - self.down_since:.0f} s")
        self.down_since, self.announced = None, False
        self.ended += 1


def describe(exc: BaseException) -> str:
    """Why a call got no answer, in a few words: the system error its innermost cause names
    ("Connection refused"), else that cause's first line (after its last "failed: ")."""
    cause = chain(exc)[-1]
    text = str(cause).strip()
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno:
        return errno.group(1).strip()
    if not text:
        return type(cause).__name__
    line = text.splitlines()[0]
    return line.rpartition("failed: ")[2][:160]  # libpq: "connection to ... failed: WHY"


def chain(exc: BaseException) -> list[BaseException]:
    """An error and every error it was raised from or while handling."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


# PostgreSQL's SQLSTATEs of a server gone or not yet back: class 08 (connection exception),
# admin and crash shutdown, cannot connect now (starting up).
_PG_GONE = ("08", "57P01", "57P02", "57P03")
_MYSQL_GONE = frozenset({2002, 2003, 2006, 2013})  # can't connect, server gone, lost connection


def transient_database_error(exc: BaseException) -> bool:
    """Whether a database call failed because its server is gone or not answering (a restart,
    a network cut), not because of the statement: SQLAlchemy's disconnect errors and the
    drivers' connection failures (psycopg, psycopg2, PyMySQL)."""
    import sqlalchemy

    for error in chain(exc):
        if not isinstance(error, sqlalchemy.exc.DBAPIError):
            continue
        if error.connection_invalidated:
            return True
        orig: Any = error.orig
        if isinstance(error, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            if hasattr(orig, "sqlstate"):  # psycopg 3: None when no server answered at all
                state = orig.sqlstate
                return state is None or str(state).startswith(_PG_GONE)
            if hasattr(orig, "pgcode"):  # psycopg2
                return orig.pgcode is None or str(orig.pgcode).startswith(_PG_GONE)
            code = orig.args[0] if orig is not None and orig.args else None
            return code in _MYSQL_GONE
        return False
    return False
