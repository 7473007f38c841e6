"""Backends run a JobSpec somewhere. Each module is imported only when its backend is used."""

from __future__ import annotations

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
    if config.name == "local":
        from paiexp.backends.local import LocalBackend

        return LocalBackend(config, base_dir)
    if config.name == "pai":
        from paiexp.backends.pai import PaiBackend

        return PaiBackend(config, base_dir)
    if config.name == "docker":
        from paiexp.backends.docker import DockerBackend

        return DockerBackend(config, base_dir)
    raise UserError(f"backend.name: unknown backend {config.name!r}; available: local, pai, docker")
