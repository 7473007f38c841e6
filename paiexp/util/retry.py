"""Retrying transient cloud errors: capped exponential backoff with full jitter."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, retry: int) -> float:
        """Seconds to sleep before retry number ``retry`` (0-based): uniform in [0, cap]."""
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**retry))


def call_with_retries(
    call: Callable[[], T],
    *,
    policy: RetryPolicy,
    transient: Callable[[BaseException], bool],
    what: str,
    before_retry: Callable[[], T | None] | None = None,
) -> T:
    """``call()``, retried while it raises a ``transient`` error, up to ``policy.attempts``.

    ``before_retry`` runs before each retry and may return a result instead: for calls that
    are not idempotent, it finds out whether the failed attempt took effect after all.
    """
    for attempt in range(policy.attempts):
        if attempt and before_retry is not None:
            found = before_retry()
            if found is not None:
                return found
        try:
            return call()
        except Exception as exc:
            if not transient(exc) or attempt + 1 >= policy.attempts:
                raise
            pause = policy.delay(attempt)
            log.info("%s: %s; retry %d in %.1f s", what, _short(exc), attempt + 1, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")  # the loop returns or raises


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}"
