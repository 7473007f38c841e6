"""``paiexp tensorboard``: TensorBoard over a run's event files, or over every trial of a sweep
(each trial a named run in TensorBoard: ``trial-3``), as the PAI SDK's
``Estimator.tensorboard()`` opens one over a job's channel.

Each run's tensorboard channel is where its ``paiexp.output.tensorboard`` tag says: a local
directory is used in place; a channel on OSS is copied into ``.paiexp/tensorboard/<job>``
(new bytes only, as while the job ran), so a sweep still running is seen as it grows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from paiexp.commands.download import (
    OUTPUT_TAG_PREFIX,
    RUN_ID,
    StoredRun,
    run_store,
    sweep_by_name,
)
from paiexp.errors import UserError
from paiexp.tracking.mlflow_tracker import KIND_TAG, PARENT_RUN_TAG, STEP_TAG, tracking_uri

CHANNEL_TAG = f"{OUTPUT_TAG_PREFIX}tensorboard"
DEFAULT_PORT = 6006


def logdirs(
    config: Any, target: str, base_dir: Path, overrides: Sequence[str] = ()
) -> dict[str, Path]:
    """TensorBoard's run name -> a local directory of its event files, for ``target``: a run
    id (a sweep's or a pipeline's parent run: each of its trials or steps), or a sweep's study
    name.  ``overrides`` edit the runs' stored configs (the OSS settings of a PAI run)."""
    uri = tracking_uri(config.tracker.uri)
    runs = run_store(config, uri)
    run = runs.get(target) if RUN_ID.fullmatch(target) else None
    if run is None:
        run = sweep_by_name(runs, target, uri)
    members = [run]
    if run.tags.get(KIND_TAG) in ("sweep", "pipeline"):
        members = list(reversed(runs.tagged({PARENT_RUN_TAG: run.run_id})))
    found = {
        _name(member): _local(member, base_dir, overrides)
        for member in members
        if member.tags.get(CHANNEL_TAG)
    }
    if not found:
        raise UserError(
            f"SWEEP|RUN_ID: {target!r} has no run with a tensorboard channel yet "
            "(its jobs have not been submitted)"
        )
    return found


def _name(run: StoredRun) -> str:
    """A run's name in TensorBoard: ``trial-N``, a pipeline step's name, else its job's."""
    if "paiexp.trial_number" in run.tags:
        return f"trial-{run.tags['paiexp.trial_number']}"
    return run.tags.get(STEP_TAG) or run.tags.get("paiexp.job_name") or run.run_id


def _local(run: StoredRun, base_dir: Path, overrides: Sequence[str]) -> Path:
    uri = run.tags[CHANNEL_TAG]
    if not uri.startswith("oss://"):
        return Path(uri.removeprefix("file://"))
    from paiexp.backends.pai import make_transfer
    from paiexp.cloud.credentials import credential_client
    from paiexp.cloud.oss import OssUri
    from paiexp.config.compose import from_yaml, to_object

    backend = to_object(from_yaml(run.config_text(), overrides)).backend
    if backend.name != "pai":
        raise UserError(f"cannot read {uri}: run {run.run_id}'s backend has no OSS settings")
    local = base_dir / ".paiexp" / "tensorboard" / run.tags.get("paiexp.job_name", run.run_id)
    make_transfer(backend, credential_client()).mirror_growing(OssUri.parse(uri), local)
    local.mkdir(parents=True, exist_ok=True)
    return local


def command(directories: dict[str, Path], port: int) -> list[str]:
    """TensorBoard's command line over ``directories`` (its ``--logdir_spec``: name:path,...)."""
    for name, path in directories.items():
        if "," in f"{name}{path}" or ":" in name:
            raise UserError(f"TensorBoard cannot name run {name!r} at {path}: ',' or ':' in it")
    spec = ",".join(f"{name}:{path}" for name, path in directories.items())
    return [sys.executable, "-m", "tensorboard.main", "--logdir_spec", spec, "--port", str(port)]


def serve(argv: list[str], say: Callable[[str], None] = print) -> None:
    """Replace this process by TensorBoard (its output, its Ctrl-C)."""
    say(f"TensorBoard at http://localhost:{argv[argv.index('--port') + 1]}/ (Ctrl-C stops it)")
    sys.stdout.flush()
    os.execv(argv[0], argv)
