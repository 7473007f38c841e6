"""The distributed contract in the tasks of a multi-instance OpenPAI job.

OpenPAI sets no ``MASTER_ADDR``: it gives each task of a task role every task's address
(``PAI_HOST_IP_<role>_<index>``) and reserved ports (``PAI_PORT_LIST_<role>_<index>_<label>``),
the role's task count and the task's index (``PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX``).
The job reserves one port per task, and each task's commands export the variables of
:mod:`paiexp.contract.distributed` (names and values a local or PAI instance gets: the task's index
is
its rank, task 0 the master) from OpenPAI's, and ``GLOO_SOCKET_IFNAME=eth0``, the interface
gloo must use there.
"""

from __future__ import annotations

from collections.abc import Iterable

from paiexp.contract.distributed import Topology

PORT_LABEL = "dist"  # the port each task reserves: the master's is MASTER_PORT
TASK_INDEX = "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"
SOCKET_INTERFACE = "eth0"


def reserved_ports(count: int) -> dict[str, int]:
    """``resourcePerInstance.ports`` of a task role of ``count`` tasks: label -> ports."""
    return {PORT_LABEL: 1} if count > 1 else {}


def exports(role: str, topology: Topology) -> list[str]:
    """Shell lines exporting the distributed variables of the running task's rank."""
    hosts = [f"PAI_HOST_IP_{role}_{index}" for index in range(topology.count)]
    ports = [f"PAI_PORT_LIST_{role}_{index}_{PORT_LABEL}" for index in range(topology.count)]
    addresses = [(_marker(host), _marker(port)) for host, port in zip(hosts, ports, strict=True)]
    lines = [f'case "${TASK_INDEX}" in']
    for rank in range(topology.count):
        env = topology.environment(rank, addresses)
        words = " ".join(f"{name}={_word(value, hosts + ports)}" for name, value in env.items())
        lines.append(f"  {rank}) export {words} ;;")
    lines += ["esac", f"export GLOO_SOCKET_IFNAME={SOCKET_INTERFACE}"]
    return lines


def _marker(variable: str) -> str:
    return f"<{variable}>"


def _word(value: str, variables: Iterable[str]) -> str:
    """``value`` as one shell word, each variable's marker in it that variable's value."""
    word = "'" + value.replace("'", "'\\''") + "'"
    for variable in variables:
        word = word.replace(_marker(variable), f"'\"${{{variable}}}\"'")
    return word
