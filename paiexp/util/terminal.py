"""What paiexp tells a person while a job runs (submitted, stopping, its summary): the
``paiexp.terminal`` logger.  The command line shows it on stderr as ``[paiexp] ...``; the
Python API leaves it to the program (Python's logging shows warnings only unless told more:
a notebook adds a handler, or ``logging.basicConfig(level="INFO")``)."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("paiexp.terminal")


def say(message: str) -> None:
    """Something a person follows a job by."""
    log.info(message)


def warn(message: str) -> None:
    """Something a person should hear even from a library call."""
    log.warning(message)


def show_on_stderr() -> None:
    """The command line's terminal: every message on stderr, each as ``[paiexp] ...``."""
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[paiexp] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
