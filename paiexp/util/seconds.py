"""Settings given in seconds (intervals, timeouts, grace periods): a finite number, no
longer than Python can wait (a longer one overflows its clocks once a wait or timer takes it;
NaN passes every ``<= 0`` check and breaks the first wait)."""

from __future__ import annotations

import threading

from paiexp.errors import UserError

MAX_SECONDS = threading.TIMEOUT_MAX  # about 292 years


def check_seconds(key: str, value: float | None, *, zero: bool = False, null: bool = False) -> None:
    """``value``, the setting ``key``, is seconds > 0 (``zero``: >= 0) and at most
    MAX_SECONDS (``null``: or None); else a UserError naming ``key`` and what is valid."""
    if value is None and null:
        return
    if value is None or not (value >= 0 if zero else value > 0) or not value <= MAX_SECONDS:
        valid = f"{'>= 0' if zero else '> 0'} and at most {MAX_SECONDS:.0f}"
        raise UserError(
            f"{key}: must be a number of seconds {valid}{' or null' if null else ''}, got {value}"
        )
