"""Checks every backend makes the same way: its numeric settings, and which of a job's channels
are on OSS and which are local paths."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paiexp.config.schema import InstallMode
from paiexp.config.spec import JobSpec, creatable_path
from paiexp.errors import UserError
from paiexp.util.seconds import check_seconds

OSS_SCHEME = "oss://"

log = logging.getLogger(__name__)


def check_positive(config: Any, *keys: str) -> None:
    """Each ``backend.KEY``, a number of seconds, must be > 0 (and finite)."""
    for key in keys:
        check_seconds(f"backend.{key}", getattr(config, key))


def check_retry(retry: Any) -> None:
    """``backend.retry``: at least one attempt, delays of seconds >= 0."""
    if retry.attempts < 1:
        raise UserError(f"backend.retry.attempts: must be >= 1, got {retry.attempts}")
    for key in ("base_delay", "max_delay"):
        check_seconds(f"backend.retry.{key}", getattr(retry, key), zero=True)


def check_process_settings(config: Any) -> InstallMode:
    """The settings of backends that run processes on this machine (local, docker); returns
    how they install a job's requirements."""
    check_positive(config, "poll_interval")
    check_seconds("backend.stop_grace_period", config.stop_grace_period, zero=True)
    return install_mode(config.install_requirements)


def check_root(root: str, base_dir: Path) -> Path:
    """``backend.root``, the directory of a backend's jobs here, as an absolute path: a
    writable directory, or one that can be made; else a UserError."""
    path = creatable_path("backend.root", root, base_dir)
    if path.exists() and not (path.is_dir() and os.access(path, os.W_OK | os.X_OK)):
        raise UserError(f"backend.root: {root!r} is not a writable directory")
    return path


def install_mode(value: Any) -> InstallMode:
    """``backend.install_requirements`` as an InstallMode (composed configs hold one already)."""
    try:
        return InstallMode(value)
    except ValueError:
        raise UserError(
            f"backend.install_requirements: invalid value {value!r}; "
            f"expected one of {', '.join(InstallMode)}"
        ) from None


def oss_channels(channels: Mapping[str, str | None]) -> dict[str, str]:
    """The channels whose URI is on OSS."""
    return {name: uri for name, uri in channels.items() if uri and uri.startswith(OSS_SCHEME)}


def local_channels(channels: Mapping[str, str | None]) -> dict[str, str]:
    """The channels given a local path (an output left unset is neither)."""
    return {name: uri for name, uri in channels.items() if uri and not uri.startswith(OSS_SCHEME)}


def check_local_inputs(spec: JobSpec) -> None:
    """Every input given as a local path exists (before anything is submitted)."""
    for channel, uri in local_channels(spec.inputs).items():
        if not Path(uri).exists():
            raise UserError(f"job.inputs.{channel}: no such file or directory: {uri}")


def check_local_job(spec: JobSpec, backend: str) -> None:
    """What a backend that runs a job on this machine checks alike: local inputs exist,
    outputs are no ``oss://`` URIs (they stay here)."""
    check_local_inputs(spec)
    for channel, uri in oss_channels(spec.outputs).items():
        raise UserError(
            f"job.outputs.{channel}: backend={backend} writes local paths only, got {uri!r}"
        )
    if spec.checkpoints and spec.checkpoints.startswith(OSS_SCHEME):
        raise UserError(
            f"job.checkpoints: backend={backend} starts from a local directory only, "
            f"got {spec.checkpoints!r}"
        )


def warn_one_instance(spec: JobSpec, backend: str, runs_as: str) -> None:
    """A backend that runs a job as one ``runs_as`` says that ``instance_count`` is moot."""
    if spec.instance_count > 1:
        log.warning(
            "backend=%s runs one %s; job.instance_count=%d is ignored",
            backend,
            runs_as,
            spec.instance_count,
        )
