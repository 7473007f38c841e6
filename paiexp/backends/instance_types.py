"""A catalog of common PAI/ECS instance types: vCPUs, memory and GPUs, for local limits.

The Docker backend gives a container the CPU and memory limits (and GPU request) of its
``job.instance_type`` so that a job that runs out of memory locally would on PAI too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from paiexp.errors import UserError

GIB = 1 << 30
UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": GIB, "t": 1 << 40}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class InstanceType:
    cpus: int
    memory_gib: float
    gpus: int = 0

    def describe(self) -> str:
        gpus = f" / {self.gpus} GPU" if self.gpus else ""
        return f"{self.cpus} vCPU / {self.memory_gib:g} GiB{gpus}"


def _family(prefix: str, gib_per_cpu: int) -> dict[str, InstanceType]:
    sizes = {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32}
    return {
        f"{prefix}.{size}": InstanceType(cpus, cpus * gib_per_cpu) for size, cpus in sizes.items()
    }


CATALOG: dict[str, InstanceType] = {
    # general purpose families: compute (c, 2 GiB per vCPU), general (g, 4), memory (r, 8)
    **_family("ecs.c6", 2),
    **_family("ecs.c7", 2),
    **_family("ecs.g6", 4),
    **_family("ecs.g7", 4),
    **_family("ecs.r6", 8),
    **_family("ecs.r7", 8),
    # GPU: gn6i (T4), gn6v (V100), gn6e (V100 32 GB), gn7i (A10)
    "ecs.gn6i-c4g1.xlarge": InstanceType(4, 15, 1),
    "ecs.gn6i-c8g1.2xlarge": InstanceType(8, 31, 1),
    "ecs.gn6i-c16g1.4xlarge": InstanceType(16, 62, 1),
    "ecs.gn6i-c24g1.6xlarge": InstanceType(24, 93, 1),
    "ecs.gn6v-c8g1.2xlarge": InstanceType(8, 32, 1),
    "ecs.gn6v-c8g1.8xlarge": InstanceType(32, 128, 4),
    "ecs.gn6e-c12g1.3xlarge": InstanceType(12, 92, 1),
    "ecs.gn7i-c8g1.2xlarge": InstanceType(8, 30, 1),
    "ecs.gn7i-c16g1.4xlarge": InstanceType(16, 60, 1),
    "ecs.gn7i-c32g1.8xlarge": InstanceType(32, 188, 1),
}


@dataclass(frozen=True)
class Resources:
    """What a container gets: ``None`` means no limit. ``source`` says where they come from."""

    cpus: float | None
    memory: int | None  # bytes
    gpus: int
    source: str


def parse_size(key: str, value: str) -> int:
    """``512m``, ``4g``, ``16GiB`` or a number of bytes -> bytes (units are binary)."""
    match = SIZE.match(value)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"{key}: invalid value {value!r}; expected a size like 512m, 4g or 16GiB")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def format_size(size: int) -> str:
    """Bytes as people write limits: ``4 GiB``, ``64 MiB``."""
    for unit, name in ((GIB, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            return f"{size / unit:.4g} {name}"
    return f"{size} B"


def resolve(
    instance_type: str | None,
    cpus: float | None = None,
    memory: str | None = None,
    gpus: int | None = None,
    backend: str = "docker",
) -> Resources:
    """The limits of ``instance_type``, each replaced by an explicit ``backend.*`` override.

    An unknown instance type is an error unless both ``cpus`` and ``memory`` are given.
    No instance type (and no override) means no limits.
    """
    if cpus is not None and cpus <= 0:
        raise UserError(f"backend.cpus: invalid value {cpus}; expected a number of CPUs > 0")
    if gpus is not None and gpus < 0:
        raise UserError(f"backend.gpus: invalid value {gpus}; expected a number of GPUs >= 0")
    memory_bytes = parse_size("backend.memory", memory) if memory is not None else None
    known = CATALOG.get(instance_type) if instance_type else None
    if instance_type and known is None and (cpus is None or memory is None):
        raise UserError(
            f"job.instance_type: unknown instance type {instance_type!r} for backend={backend}; "
            f"known: {', '.join(CATALOG)}; or set backend.cpus and backend.memory"
        )
    overrides = [
        f"backend.{name}={value}"
        for name, value in (("cpus", cpus), ("memory", memory), ("gpus", gpus))
        if value is not None
    ]
    parts = ([f"instance type {instance_type}"] if known else []) + overrides
    return Resources(
        cpus=cpus if cpus is not None else (known.cpus if known else None),
        memory=memory_bytes
        if memory_bytes is not None
        else (int(known.memory_gib * GIB) if known else None),
        gpus=gpus if gpus is not None else (known.gpus if known else 0),
        source=", ".join(parts) or "no instance type",
    )
