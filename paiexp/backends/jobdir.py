"""Job directories: one per job under a root, created once by an atomic rename, found by name.

Each holds the job's ``spec.json`` (secrets redacted) and its ``/ml`` tree of the PAI contract
(:mod:`paiexp.contract.layout`), which a local process uses in place and a container mounts::

    <root>/<job name>/spec.json
                      ml/usercode (and ml/code, a link to it), ml/input/config/hyperparameters.json,
                      ml/output/<channel>, ml/output/output_parameters

Backends add their own files beside these (state, logs, entry scripts).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from paiexp.backends.base import JobHandle, LogChunk
from paiexp.config.spec import JobSpec, local_path
from paiexp.contract import layout as contract
from paiexp.contract.source import copy_source
from paiexp.metrics.extraction import read_output_parameters
from paiexp.util.jsonfiles import read_json

SPEC_FILE = "spec.json"
STARTUP_TIMEOUT = 60.0  # a job directory that nothing has started after this long never will


class JobDirectories:
    """The job directories under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, name: str) -> Path:
        return self.root / name

    def layout(self, name: str) -> contract.JobLayout:
        """The job's ``/ml`` tree on this machine."""
        return contract.JobLayout(self.path(name) / "ml")

    def exists(self, name: str) -> bool:
        """Whether a job of this name was ever created here."""
        return (self.path(name) / SPEC_FILE).is_file()

    def create(self, spec: JobSpec, add_files: Callable[[Path], None]) -> Path:
        """The job's directory, laid out in a staging directory and renamed into place, so
        that it appears complete or not at all; ``add_files`` adds the backend's own files.

        A racing launcher that creates the same job first wins: that is not an error.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".staging-{spec.name}-", dir=self.root))
        try:
            lay_out(spec, contract.JobLayout(staging / "ml"))
            add_files(staging)
            # Secrets reach the command through its environment only, never a file.
            (staging / SPEC_FILE).write_text(json.dumps(spec.to_dict(redact=True), indent=2))
            os.rename(staging, self.path(spec.name))
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if not (isinstance(exc, OSError) and self.exists(spec.name)):
                raise  # not a lost race for the name: a real error
        return self.path(spec.name)

    def load_spec(self, name: str) -> JobSpec:
        """The job's spec as submitted (secrets redacted)."""
        return JobSpec.from_dict(read_json(self.path(name) / SPEC_FILE))

    def starting(self, name: str) -> bool:
        """Whether the job was created less than ``STARTUP_TIMEOUT`` ago: a job nothing has
        picked up yet may still start."""
        try:
            created = (self.path(name) / SPEC_FILE).stat().st_mtime
        except FileNotFoundError:
            return False
        return time.time() - created < STARTUP_TIMEOUT

    def outputs(self, name: str) -> dict[str, str]:
        """Output channel -> ``file://`` URI: the channel's destination, else its directory."""
        spec = self.load_spec(name)
        return {
            channel: self._output_path(spec, channel).as_uri() for channel in spec.output_channels
        }

    def output_is_empty(self, name: str, channel: str) -> bool:
        spec = self.load_spec(name)
        if channel not in spec.output_channels:
            return True
        return not any(path.is_file() for path in self._output_path(spec, channel).rglob("*"))

    def _output_path(self, spec: JobSpec, channel: str) -> Path:
        """Where the channel's files end up: its destination, else its directory here."""
        return Path(spec.outputs.get(channel) or self.layout(spec.name).output_dir(channel))

    def output_parameters(self, name: str) -> dict[str, float]:
        return read_output_parameters(Path(self.layout(name).output_parameters_dir))

    def tensorboard_dir(self, name: str) -> Path:
        """The job's tensorboard channel as it writes it (its destination gets a copy)."""
        return Path(self.layout(name).output_dir("tensorboard"))

    def own_mlflow_store(self, name: str) -> Path | None:
        """The MLflow store the job's own calls made (an experiment in it), if they did."""
        store = Path(self.layout(name).mlflow_store)
        return store if any(store.glob("*/meta.yaml")) else None


class LocalResults:
    """The result verbs of a backend whose jobs keep their outputs in job directories here
    (there is no platform to ask for metrics, nor a page to watch a job on)."""

    jobs: JobDirectories

    def outputs(self, handle: JobHandle) -> dict[str, str]:
        return self.jobs.outputs(handle.name)

    def output_parameters(self, handle: JobHandle) -> dict[str, float]:
        return self.jobs.output_parameters(handle.name)

    def output_is_empty(self, handle: JobHandle, channel: str) -> bool:
        return self.jobs.output_is_empty(handle.name, channel)

    def own_mlflow_store(self, handle: JobHandle, scratch: Path | None) -> Path | None:
        return self.jobs.own_mlflow_store(handle.name)

    def service_metrics(self, handle: JobHandle) -> dict[str, float]:
        return {}

    def tensorboard_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        return self.jobs.tensorboard_dir(handle.name)

    def own_mlflow_dir(self, handle: JobHandle, *, final: bool = False) -> Path | None:
        return self.jobs.own_mlflow_store(handle.name)

    def instance_logs(self, handle: JobHandle) -> dict[str, Path]:
        return {}  # one instance per job (backend=local has its own)

    def console_url(self, handle: JobHandle) -> str | None:
        return None


def lay_out(spec: JobSpec, layout: contract.JobLayout) -> None:
    """Create the job's ``/ml`` tree: its code, hyperparameters and output directories, each
    directory after its parent (one system call apiece: a sweep lays out thousands)."""
    os.makedirs(layout.root, exist_ok=True)
    working_dir = os.fspath(layout.working_dir)
    if spec.source_dir:
        copy_source(Path(spec.source_dir), Path(working_dir))
    else:
        os.mkdir(working_dir)
    # relative, so that it holds wherever the tree is mounted
    os.symlink(os.path.basename(working_dir), layout.code_alias, target_is_directory=True)
    config_dir = os.fspath(layout.config_dir)
    os.mkdir(os.path.dirname(config_dir))
    os.mkdir(config_dir)
    with open(layout.hyperparameters_file, "w") as stream:
        stream.write(contract.hyperparameters_json(spec.hyperparameters))
    output_dirs = [os.fspath(layout.output_dir(channel)) for channel in spec.output_dirs]
    if output_dirs:
        os.mkdir(os.path.dirname(output_dirs[0]))
    for directory in output_dirs:
        os.mkdir(directory)
    if spec.checkpoints:  # an earlier job's: this one starts with a copy of what it left
        source = Path(local_path(spec.checkpoints))
        if source.is_dir():
            shutil.copytree(source, layout.output_dir("checkpoints"), dirs_exist_ok=True)


def read_log_file(path: Path, cursor: int, final: bool) -> LogChunk:
    """Complete lines of a log file after byte offset ``cursor`` (``final``: the tail too)."""
    try:
        if os.stat(path).st_size <= cursor:  # it did not grow: spare the open and read
            return LogChunk([], cursor)
        with path.open("rb") as stream:
            stream.seek(cursor)
            data = stream.read()
    except FileNotFoundError:
        return LogChunk([], cursor)
    if not final:
        data = data[: data.rfind(b"\n") + 1]
    text = data.decode("utf-8", errors="replace")
    return LogChunk(text.splitlines(), cursor + len(data))
