"""An OpenPAI job for a JobSpec: its files on the cluster's storage, and its job protocol v2.

OpenPAI manages no storage: a job mounts a storage config at ``/mnt/<name>`` (the
``teamwise_storage`` runtime plugin) and this machine mounts the same storage at
``storage.local_path``. paiexp stages each job's ``/ml`` tree there (the job-directory core
the docker backend uses), local inputs once per content, and the task role's commands lay
out the PAI contract in the container from it::

    <storage>/<prefix>/jobs/<job>/spec.json, ml/usercode, ml/input/config, ml/output/<channel>,
                                  paiexp/failure (why the entry script gave up, if it did)
    <storage>/<prefix>/inputs/<digest>/<file or directory>

In the container ``/ml/usercode`` is a copy (the working directory), ``/ml/code`` a link to
it, and the config, inputs and outputs are links into the storage, so what a job writes to
``/ml/output/<channel>`` is on the storage when it ends. The variables are the contract's
(:func:`paiexp.contract.layout.environment`), and for a job of several instances (tasks of the role)
the distributed ones (:mod:`paiexp.backends.openpai_distributed`); secret-looking ones travel
as the protocol's ``secrets``, never in its commands. One failed task fails the job, the others
then stopped; it succeeds when every task has (the completion policy, stated). The docker
backend's entry script, its output left on stdout, then installs the requirements, watches
``max_run_time`` and runs the command.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from paiexp.backends import openpai_distributed
from paiexp.backends.docker_entry import entry_script
from paiexp.backends.instance_types import Resources
from paiexp.backends.threads import thread_environment
from paiexp.config.spec import JobSpec
from paiexp.contract import job_mlflow
from paiexp.contract import layout as contract
from paiexp.contract.distributed import Topology, job_type
from paiexp.contract.source import copy_source, source_digest
from paiexp.util.redact import SECRET_NAME

ROLE = "train"  # the job's one task role
IMAGE = "image"  # its dockerimage prerequisite
MOUNT_ROOT = PurePosixPath("/mnt")
STORAGE_PLUGIN = "teamwise_storage"
STATE_DIR = "paiexp"  # beside the job's ml/: the entry script's failure note
STOP_GRACE_PERIOD = 10.0  # max_run_time: SIGTERM, then SIGKILL after this


@dataclass(frozen=True)
class Storage:
    """A storage config: ``/mnt/<name>`` in containers, ``local`` on this machine."""

    name: str
    local: Path
    prefix: str

    @property
    def root(self) -> Path:
        """paiexp's files on the storage, as this machine sees them."""
        return self.local / self.prefix

    def holds(self, path: Path) -> bool:
        return path.resolve().is_relative_to(self.local.resolve())

    def in_container(self, path: Path) -> PurePosixPath:
        """Where a path under ``local`` is in a job's container."""
        return MOUNT_ROOT / self.name / path.resolve().relative_to(self.local.resolve()).as_posix()


def stage_input(storage: Storage, path: Path) -> Path:
    """A local input on the storage: itself if it is there already, else a copy under
    ``inputs/<digest>/`` made once per name and content (appearing whole, or not at all)."""
    if storage.holds(path):
        return path
    if path.is_dir():
        content = source_digest(path)
    else:
        with path.open("rb") as stream:
            content = hashlib.file_digest(stream, "sha256").hexdigest()
    key = hashlib.sha256(f"{path.name}\0{content}".encode()).hexdigest()[:32]
    inputs = storage.root / "inputs"
    target = inputs / key / path.name
    if not target.exists():
        inputs.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=inputs))
        try:
            if path.is_dir():
                copy_source(path, staging / path.name)
            else:
                shutil.copy2(path, staging / path.name)
            os.rename(staging, inputs / key)
        except OSError:
            if not target.exists():  # not a racing launcher's copy: a real error
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def protocol(
    spec: JobSpec,
    *,
    storage: Storage,
    job_dir: Path,
    inputs: Mapping[str, Path],
    image: str,
    resources: Resources,
    virtual_cluster: str,
    job_retry_count: int,
    install_mode: str,
) -> dict[str, Any]:
    """The job protocol v2 of ``spec``, whose files are in ``job_dir`` and staged ``inputs``."""
    cpus = math.ceil(resources.cpus or 1)
    secrets = {k: v for k, v in spec.environments.items() if SECRET_NAME.search(k)}
    topology = Topology(spec.instance_count, job_type(spec.job_type), resources.gpus)
    ports = openpai_distributed.reserved_ports(spec.instance_count)
    job: dict[str, Any] = {
        "protocolVersion": 2,
        "name": spec.name,
        "type": "job",
        "jobRetryCount": job_retry_count,
        "prerequisites": [{"type": "dockerimage", "name": IMAGE, "uri": image}],
        "taskRoles": {
            ROLE: {
                "instances": spec.instance_count,
                "completion": {"minFailedInstances": 1, "minSucceededInstances": -1},
                "dockerImage": IMAGE,
                "resourcePerInstance": {
                    "cpu": cpus,
                    "memoryMB": (resources.memory or 0) >> 20,
                    "gpu": resources.gpus,
                    **({"ports": ports} if ports else {}),
                },
                "commands": commands(
                    spec, storage, job_dir, inputs, cpus, secrets, install_mode, topology
                ),
            }
        },
        "defaults": {"virtualCluster": virtual_cluster},
        "extras": {
            "com.microsoft.pai.runtimeplugin": [
                {"plugin": STORAGE_PLUGIN, "parameters": {"storageConfigNames": [storage.name]}}
            ]
        },
    }
    if secrets:  # base64: any value survives the <% %> substitution into a quoted word
        job["secrets"] = {k: base64.b64encode(v.encode()).decode() for k, v in secrets.items()}
    return job


def commands(
    spec: JobSpec,
    storage: Storage,
    job_dir: Path,
    inputs: Mapping[str, Path],
    cpus: int,
    secrets: Mapping[str, str],
    install_mode: str,
    topology: Topology,
) -> list[str]:
    """Shell lines: the ``/ml`` tree and the variables of the contract (the distributed ones
    for a job of several instances), then the entry script."""
    ml = contract.JobLayout()
    staged = contract.JobLayout(storage.in_container(job_dir) / "ml")
    q = shlex.quote
    lines = [
        "set -eu",
        f"mkdir -p {ml.root / 'input' / 'data'} {ml.root / 'output'}",
        f"cp -R {q(str(staged.working_dir))} {ml.working_dir}",
        f"ln -s {ml.working_dir.name} {ml.code_alias}",
        f"ln -s {q(str(staged.config_dir))} {ml.config_dir}",
    ]
    input_files: dict[str, str | None] = {}
    for channel, path in inputs.items():
        source, target = q(str(storage.in_container(path))), ml.input_dir(channel)
        if path.is_dir():
            input_files[channel] = None
            lines.append(f"ln -s {source} {target}")
        else:
            input_files[channel] = path.name
            lines += [f"mkdir {target}", f"ln -s {source} {q(str(target / path.name))}"]
    for channel in spec.output_dirs:
        destination = spec.outputs.get(channel)
        where = (
            storage.in_container(Path(destination)) if destination else staged.output_dir(channel)
        )
        lines.append(f"ln -s {q(str(where))} {ml.output_dir(channel)}")
    lines.append(f"ln -s {q(str(storage.in_container(job_dir / STATE_DIR)))} /{STATE_DIR}")
    env = {"PYTHONUNBUFFERED": "1", **thread_environment(cpus)}
    env.update((k, v) for k, v in spec.environments.items() if k not in secrets)
    env.update(contract.environment(ml, spec.hyperparameters, input_files, spec.output_dirs))
    env.update(job_mlflow.environment(spec.environments, ml))
    lines += [f"export {name}={q(value)}" for name, value in env.items()]
    lines += [
        f"export {name}=\"$(printf %s '<% $secrets.{name} %>' | base64 -d)\"" for name in secrets
    ]
    if topology.count > 1:
        lines += openpai_distributed.exports(ROLE, topology)
    lines.append("set +eu")
    working_dir = Path(contract.JobLayout(job_dir / "ml").working_dir)
    script = entry_script(spec, working_dir, install_mode, STOP_GRACE_PERIOD, log_file=None)
    return [*lines, *script.splitlines()]
