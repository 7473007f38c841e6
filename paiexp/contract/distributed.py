"""The distributed contract of a multi-instance job, as PAI-DLC gives it to every instance.

A job of ``instance_count`` > 1 runs as that many instances: the master (rank 0), then the
workers.  Each gets, besides the ``PAI_*`` contract (:mod:`paiexp.contract.layout`), where the
master
is (``MASTER_ADDR``, ``MASTER_PORT``), how many instances there are (``WORLD_SIZE``), which one
it is (``RANK``), how many processes to start on it (``NPROC_PER_NODE``: its GPUs, else 1) and,
for a TFJob, ``TF_CONFIG``.  Instances are named as DLC names them (``master-0``,
``worker-0``, ...; a TFJob's are all workers), which names their logs and their places.

Every backend builds the environment here; only where the instances are (their addresses)
is the backend's own.  Standard library only: the local runner imports it without ``site``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

PYTORCH_JOB = "PyTorchJob"  # the PAI SDK's default job type
TF_JOB = "TFJob"
MASTER, WORKER = "master", "worker"

Address = tuple[str, int]  # an instance's host and port


@dataclass(frozen=True)
class Topology:
    """A multi-instance job's shape: its instances, its job type, the GPUs of each instance."""

    count: int
    job_type: str = PYTORCH_JOB
    gpus: int = 0

    def name(self, rank: int) -> str:
        """The instance of ``rank`` as DLC names it: ``master-0``, then ``worker-0``, ...; a
        TFJob's instances are all workers (``worker-<rank>``, as its ``TF_CONFIG`` says)."""
        if self.job_type == TF_JOB:
            return f"{WORKER}-{rank}"
        return f"{MASTER}-0" if rank == 0 else f"{WORKER}-{rank - 1}"

    @property
    def names(self) -> list[str]:
        """Every instance's name, by rank (the master's first)."""
        return [self.name(rank) for rank in range(self.count)]

    def environment(self, rank: int, addresses: Sequence[tuple[str, int | str]]) -> dict[str, str]:
        """The variables instance ``rank`` gets, ``addresses`` being every instance's by rank
        (a PyTorchJob's workers only need the master's, the first); a port may be text (on
        OpenPAI, a marker of the variable its task reads it from)."""
        if len(addresses) != self.count:
            raise ValueError(f"{self.count} instances, {len(addresses)} addresses")
        master_host, master_port = addresses[0]
        env = {
            "MASTER_ADDR": master_host,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(self.count),
            "RANK": str(rank),
            "NPROC_PER_NODE": str(self.gpus or 1),
        }
        if self.job_type == TF_JOB:
            env["TF_CONFIG"] = json.dumps(
                {
                    "cluster": {WORKER: [f"{host}:{port}" for host, port in addresses]},
                    "task": {"type": WORKER, "index": rank},
                    "environment": "cloud",
                }
            )
        return env

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        return cls(count=int(data["count"]), job_type=str(data["job_type"]), gpus=int(data["gpus"]))


def job_type(value: str | None) -> str:
    """A job's type: its own ``job.job_type``, else PAI's default."""
    return value or PYTORCH_JOB
