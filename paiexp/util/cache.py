"""paiexp's per-user cache directory (``$XDG_CACHE_HOME/paiexp``, else ``~/.cache/paiexp``)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paiexp"
