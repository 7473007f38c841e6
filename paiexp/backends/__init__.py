"""Backends run a JobSpec somewhere. Each module is imported only when its backend is used."""

from __future__ import annotations

from importlib import import_module

from paiexp.errors import UserError

TYPE_CHECKING = False  # typing itself is not loaded: a job's runner imports this package
if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    """The protocol's names, from :mod:`paiexp.backends.base` when first asked for: a job's
    runner (:mod:`paiexp.backends.local_runner`, started for every job) needs none of them."""
    if name in __all__:
        return getattr(import_module("paiexp.backends.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_backend(config: Any, base_dir: Path) -> Backend:
    """The backend a composed ``backend`` config names; relative paths are under ``base_dir``."""
    from paiexp.config.schema import BACKENDS  # the schemas load Hydra: only when a backend is made

    kind = BACKENDS.get(config.name)
    if kind is None:
        raise UserError(
            f"backend.name: unknown backend {config.name!r}; available: {', '.join(BACKENDS)}"
        )
    backend: Backend = getattr(import_module(kind.module), kind.class_name)(config, base_dir)
    return backend
