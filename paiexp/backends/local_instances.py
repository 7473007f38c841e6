"""The launcher's side of a multi-instance local job: its instances' directories and logs.

Beside the job's own files (:mod:`paiexp.backends.local`), a job of ``instance_count`` > 1
holds its :class:`~paiexp.contract.distributed.Topology` and a directory per instance, each an
ordinary local job directory that its own runner runs (:mod:`paiexp.backends.local_group`)::

    <job>/topology.json                  count, job type, GPUs per instance
          ml/output/<channel>            the output channels: one for the job, as on PAI
          instances/<name>/spec.json     the job's spec (outputs persisted, and max_run_time
                                         kept, by the job's runner)
                           ml/...        the instance's own /ml: its code, config, inputs;
                                         ml/output/<channel> links to the job's channel
                           job.log       the instance's log (the master's is the job's)
                           state.json, runner.lock

``<name>`` is the instance's as DLC names it (``master-0``, ``worker-0``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paiexp.backends.instance_types import CATALOG
from paiexp.backends.jobdir import SPEC_FILE, lay_out
from paiexp.backends.local_group import INSTANCES_DIR, TOPOLOGY_FILE
from paiexp.config.spec import JobSpec
from paiexp.contract import layout as contract
from paiexp.contract.distributed import Topology, job_type
from paiexp.errors import UserError
from paiexp.util.jsonfiles import read_json

INSTANCES_PER_CPU = 2  # a sane limit: each instance gets at least half a CPU
JOB_LOG = "job.log"


def topology(spec: JobSpec) -> Topology:
    """The job's instances: its count and type, and the GPUs of its instance type."""
    known = CATALOG.get(spec.instance_type or "")
    return Topology(spec.instance_count, job_type(spec.job_type), known.gpus if known else 0)


def check_instance_count(spec: JobSpec, backend: str) -> None:
    """At most :data:`INSTANCES_PER_CPU` instances per CPU of this machine."""
    cpus = len(os.sched_getaffinity(0))
    limit = INSTANCES_PER_CPU * cpus
    if spec.instance_count > limit:
        raise UserError(
            f"job.instance_count: {spec.instance_count} instances are too many for "
            f"backend={backend} on this machine's {cpus} CPUs; expected 1 to {limit} "
            f"({INSTANCES_PER_CPU} per CPU)"
        )


def lay_out_instances(
    spec: JobSpec, staging: Path, job_dir: Path, link_inputs: Callable[[JobSpec, Path], None]
) -> None:
    """Add the instances of a multi-instance job to its directory, laid out in ``staging``
    (which becomes ``job_dir``); ``link_inputs`` links a directory's input channels."""
    shape = topology(spec)
    (staging / TOPOLOGY_FILE).write_text(json.dumps(shape.to_dict()))
    part = dataclasses.replace(spec, max_run_time=None, outputs=dict.fromkeys(spec.outputs))
    shared = contract.JobLayout(job_dir / "ml")
    for name in shape.names:
        directory = staging / INSTANCES_DIR / name
        layout = contract.JobLayout(directory / "ml")
        lay_out(part, layout)
        link_inputs(part, directory)
        for channel in spec.output_dirs:  # absolute: they hold in the instance's /ml view
            output = Path(layout.output_dir(channel))
            output.rmdir()
            output.symlink_to(shared.output_dir(channel), target_is_directory=True)
        (directory / SPEC_FILE).write_text(json.dumps(part.to_dict(redact=True), indent=2))
    (staging / INSTANCES_DIR / shape.names[0] / JOB_LOG).symlink_to(Path("..", "..", JOB_LOG))


def instance_logs(job_dir: Path) -> dict[str, Path]:
    """Each instance's log file by instance name ({} for a one-instance job)."""
    data = read_json(job_dir / TOPOLOGY_FILE)
    if data is None:
        return {}
    names = Topology.from_dict(data).names
    logs = {name: job_dir / INSTANCES_DIR / name / JOB_LOG for name in names}
    return {name: path for name, path in logs.items() if path.exists()}


def instance_states(job_dir: Path) -> list[dict[str, Any]]:
    """The states its instances' runners wrote ([] for a one-instance job)."""
    states = (read_json(path) for path in (job_dir / INSTANCES_DIR).glob("*/state.json"))
    return [state for state in states if state]
