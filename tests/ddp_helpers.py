"""What every backend's run of the DDP example (examples/ddp, 2 instances) must show."""

from __future__ import annotations

from collections.abc import Mapping


def assert_trained_in_step(logs: Mapping[str, str]) -> None:
    """Both instances' logs (by instance name): each printed one checksum of its final
    parameters, the same (DDP kept them in step), and rank 0 alone wrote the model."""
    assert sorted(logs) == ["master-0", "worker-0"]
    checksums = {
        name: [line.split("=", 1)[1] for line in log.splitlines() if " checksum=" in line]
        for name, log in logs.items()
    }
    assert len(checksums["master-0"]) == len(checksums["worker-0"]) == 1, checksums
    assert checksums["master-0"] == checksums["worker-0"], checksums
    assert "rank 0 wrote the model" in logs["master-0"]
    assert "wrote the model" not in logs["worker-0"]
