"""What OpenPAI's runtime gives the tasks of a task role, and when it ends the role's attempt.

Every task (one container) gets OpenPAI's variables: the job's and the role's
(``PAI_TASK_ROLE_TASK_COUNT_<role>``, ``PAI_RESOURCE_<role>``, the completion policy), its own
(``PAI_CURRENT_TASK_ROLE_NAME``, ``PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX``,
``PAI_TASK_INDEX``), every task's reserved ports (``PAI_PORT_LIST_<role>_<index>_<label>``,
``resourcePerInstance.ports`` of them each) and every task's address
(``PAI_HOST_IP_<role>_<index>``). As on a real cluster, where the runtime's init container
learns the addresses once every task of the gang is placed, the addresses are known only
once every container has started: the fake writes them to a file each task's command waits
for and sources before the job's commands run.

The completion policy is FrameworkController's: the attempt fails once ``minFailedInstances``
tasks failed (default 1; -1: never), succeeds once ``minSucceededInstances`` succeeded
(default -1: never early), else when every task has completed.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

RUNTIME_DIR = PurePosixPath("/usr/local/pai/runtime")  # the addresses file, in a task
HOSTS_FILE = "hosts.env"
PORT_RANGE = (20000, 40000)  # where reserved ports are drawn from
DEFAULT_SHM_MB = 512


@dataclass(frozen=True)
class Completion:
    """A task role's completion policy."""

    min_failed: int = 1
    min_succeeded: int = -1

    @classmethod
    def of(cls, role: Mapping[str, Any]) -> Completion:
        policy = role.get("completion") or {}
        return cls(
            int(policy.get("minFailedInstances", 1)), int(policy.get("minSucceededInstances", -1))
        )

    def verdict(self, codes: Mapping[int, int], count: int) -> tuple[bool, str] | None:
        """Whether the attempt has ended, given the exit codes of the tasks that completed
        (by index) out of ``count``: (succeeded, why), or None while it goes on."""
        failed = sum(code != 0 for code in codes.values())
        succeeded = len(codes) - failed
        if self.min_failed != -1 and failed >= self.min_failed:
            return (
                False,
                f"FailedTaskCount {failed} has reached MinFailedTaskCount {self.min_failed}",
            )
        if self.min_succeeded != -1 and succeeded >= self.min_succeeded:
            return True, (
                f"SucceededTaskCount {succeeded} has reached MinSucceededTaskCount "
                f"{self.min_succeeded}"
            )
        if len(codes) == count:
            return True, "All Tasks are completed and no completion policy was triggered"
        return None


def reserve_ports(role: Mapping[str, Any], count: int) -> list[dict[str, list[int]]]:
    """Each task's reserved ports by label, distinct within a task."""
    wanted = (role.get("resourcePerInstance") or {}).get("ports") or {}
    reserved = []
    for _ in range(count):
        ports = iter(random.sample(range(*PORT_RANGE), sum(int(n) for n in wanted.values())))
        reserved.append(
            {label: [next(ports) for _ in range(int(n))] for label, n in wanted.items()}
        )
    return reserved


def task_environment(
    role_name: str, role: Mapping[str, Any], index: int, ports: Sequence[Mapping[str, list[int]]]
) -> dict[str, str]:
    """The variables of task ``index`` of the role (all but the tasks' addresses)."""
    resources = role["resourcePerInstance"]
    completion = Completion.of(role)
    shm = (role.get("extraContainerOptions") or {}).get("shmMB", DEFAULT_SHM_MB)
    env = {
        "PAI_TASK_ROLE_COUNT": "1",
        "PAI_TASK_ROLE_LIST": role_name,
        f"PAI_TASK_ROLE_TASK_COUNT_{role_name}": str(len(ports)),
        f"PAI_RESOURCE_{role_name}": (
            f"{resources.get('gpu', 0)},{resources['cpu']},{resources['memoryMB']},{shm}"
        ),
        f"PAI_MIN_FAILED_TASK_COUNT_{role_name}": str(completion.min_failed),
        f"PAI_MIN_SUCCEEDED_TASK_COUNT_{role_name}": str(completion.min_succeeded),
        "PAI_CURRENT_TASK_ROLE_NAME": role_name,
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(index),
        "PAI_TASK_INDEX": str(index),
    }
    for task, labelled in enumerate(ports):
        for label, numbers in labelled.items():
            env[f"PAI_PORT_LIST_{role_name}_{task}_{label}"] = ",".join(map(str, numbers))
    return env


def wait_for_hosts(commands: str) -> str:
    """A task's script: wait for the tasks' addresses, take them, then run ``commands``."""
    hosts = RUNTIME_DIR / HOSTS_FILE
    return (
        f"while [ ! -e {hosts} ]; do sleep 0.02; done\n"  # written once every task started
        f". {hosts}\n{commands}"
    )


def publish_hosts(directory: Path, role_name: str, addresses: Sequence[str]) -> None:
    """Every task's address, for each task to source (appearing whole, or not at all)."""
    lines = [
        f"export PAI_HOST_IP_{role_name}_{index}={shlex.quote(address)}\n"
        for index, address in enumerate(addresses)
    ]
    partial = directory / f".{HOSTS_FILE}"
    partial.write_text("".join(lines))
    partial.rename(directory / HOSTS_FILE)
