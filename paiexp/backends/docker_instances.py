"""The instances of a multi-instance docker job: their directories, containers and network.

A job of ``instance_count`` > 1 runs as that many containers on a Docker network made for
the job (named as the job's single container would be). The master (rank 0) is the job's
container as a one-instance job has it: the job's own ``ml/`` and ``paiexp/``. Every other
instance has its own copy beside them; the output channels are the job's, shared::

    <job>/topology.json                   count, job type, GPUs per instance
          ml/, paiexp/                    the master's (rank 0): its /ml, entry script, log
          ml/output/<channel>             the output channels: one for the job, as on PAI
          instances/<name>/ml/            another instance's own /ml (its code, its config)
                           paiexp/        its entry script, its log, its failure
                           container      its container was created (never twice)

Each container is named ``<job's container name>-<instance>``, labelled with its instance's
name, and reached on the network by that name (``master-0``, ``worker-0``, ...: DLC's), which
is the ``MASTER_ADDR`` every instance gets, with :data:`MASTER_PORT`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from paiexp.backends.jobdir import lay_out
from paiexp.backends.local_group import INSTANCES_DIR, TOPOLOGY_FILE
from paiexp.config.spec import JobSpec
from paiexp.contract import layout as contract
from paiexp.contract.distributed import Address, Topology
from paiexp.util.jsonfiles import read_json

INSTANCE_LABEL = "paiexp.instance"
MASTER_PORT = 23456  # PAI-DLC's
CONTAINER_FILE = "container"


@dataclass(frozen=True)
class Instance:
    """One instance of a job: its rank, its name (DLC's), its directory and container."""

    rank: int
    name: str
    directory: Path  # holds its ml/, paiexp/ and container marker
    container: str


def instances(job_dir: Path, container_name: str) -> list[Instance]:
    """The instances of the job in ``job_dir`` whose container would be ``container_name``
    ([] for a job of one instance)."""
    data = read_json(job_dir / TOPOLOGY_FILE)
    if data is None:
        return []
    shape = Topology.from_dict(data)
    return [
        Instance(
            rank,
            name,
            job_dir if rank == 0 else job_dir / INSTANCES_DIR / name,
            f"{container_name}-{name}",
        )
        for rank, name in enumerate(shape.names)
    ]


def load_topology(job_dir: Path) -> Topology:
    return Topology.from_dict(read_json(job_dir / TOPOLOGY_FILE))


def addresses(shape: Topology) -> list[Address]:
    """Every instance's address on the job's network, by rank."""
    return [(name, MASTER_PORT) for name in shape.names]


def lay_out_instances(spec: JobSpec, shape: Topology, staging: Path, entry: str) -> None:
    """Add the instances other than the master to a job laid out in ``staging``: each its own
    ``/ml`` (its output directories unused: the job's are mounted over them) and ``paiexp/``
    with the entry script ``entry`` and a log."""
    (staging / TOPOLOGY_FILE).write_text(json.dumps(shape.to_dict()))
    for name in shape.names[1:]:
        directory = staging / INSTANCES_DIR / name
        lay_out(spec, contract.JobLayout(directory / "ml"))
        (directory / "paiexp").mkdir()
        (directory / "paiexp" / "job.log").touch()
        (directory / "paiexp" / "entry.sh").write_text(entry)
