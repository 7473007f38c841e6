"""Backends run a JobSpec somewhere. Each module is imported only when its backend is used."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

from paiexp.backends.base import (
    Backend,
    BackendUnavailable,
    JobHandle,
    JobRejected,
    JobState,
    JobStatus,
    LogChunk,
)
from paiexp.errors import UserError

__all__ = [
    "Backend",
    "BackendUnavailable",
    "JobHandle",
    "JobRejected",
    "JobState",
    "JobStatus",
    "LogChunk",
    "create_backend",
]


def create_backend(config: Any, base_dir: Path) -> Backend:
    """The backend a composed ``backend`` config names; relative paths are under ``base_dir``."""
    from paiexp.config import BACKENDS  # the schemas load Hydra: only when a backend is made

    kind = BACKENDS.get(config.name)
    if kind is None:
        raise UserError(
            f"backend.name: unknown backend {config.name!r}; available: {', '.join(BACKENDS)}"
        )
    backend: Backend = getattr(import_module(kind.module), kind.class_name)(config, base_dir)
    return backend
