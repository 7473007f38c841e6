"""A pipeline's state file, ``.paiexp/pipelines/NAME.json``: what resume goes by.

It holds the pipeline's id and parent run, and per step its status, attempt, config digest
(and the redacted config, to say what changed), the job or study it runs as, its run and its
results.  It is written atomically before each step starts (so a killed launcher's successor
finds the step's job by name) and when each step ends.  One launcher at a time holds a lock
on it (the kernel releases it when the launcher dies, however it dies).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import secrets
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from paiexp.errors import UserError
from paiexp.util.jsonfiles import read_json, write_json_atomic


class StepStatus(StrEnum):
    pending = "pending"  # to run (again)
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    stopped = "stopped"  # interrupted by Ctrl-C
    skipped = "skipped"  # its condition was false, or a step it depends on was skipped
    not_run = "not-run"  # a step it depends on failed

    @property
    def ok(self) -> bool:
        """Nothing went wrong (its dependents may go on, or be skipped)."""
        return self in (StepStatus.succeeded, StepStatus.skipped)


@dataclass
class StepRecord:
    status: StepStatus
    attempt: int = 0
    digest: str | None = None  # of its config (a skipped step's: of why, and what it saw)
    config: dict[str, Any] | None = None  # the resolved config, secrets redacted
    handle: str | None = None  # the job's name, or the sweep's study name
    run_id: str | None = None
    results: dict[str, Any] | None = None
    note: str | None = None  # why it failed or was skipped

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**{**data, "status": StepStatus(data["status"])})


@dataclass
class PipelineState:
    path: Path
    pipeline_id: str = field(default_factory=lambda: secrets.token_hex(4))
    run_id: str | None = None
    closed_as: str | None = None  # the status the parent run was last closed with
    steps: dict[str, StepRecord] = field(default_factory=dict)
    _lock: TextIO | None = None
    _writing: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, base_dir: Path, name: str) -> PipelineState:
        state = cls(base_dir / ".paiexp" / "pipelines" / f"{name}.json")
        state.reload()
        return state

    def reload(self) -> None:
        """Read the file again (once the lock is held: another launcher may have written it)."""
        data = read_json(self.path)
        if data is not None:
            self.pipeline_id = data["pipeline_id"]
            self.run_id = data.get("run_id")
            self.closed_as = data.get("closed_as")
            self.steps = {s: StepRecord.from_dict(record) for s, record in data["steps"].items()}

    def save(self) -> None:
        """Write the file (from any thread: one write at a time)."""
        with self._writing:
            data = {
                "pipeline_id": self.pipeline_id,
                "run_id": self.run_id,
                "closed_as": self.closed_as,
                "steps": {name: dataclasses.asdict(r) for name, r in dict(self.steps).items()},
            }
            write_json_atomic(self.path, data)

    def lock(self) -> None:
        """Hold the pipeline's lock for the life of this process; a UserError if another
        launcher holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stream = open(self.path.with_suffix(".lock"), "a+")  # noqa: SIM115 (held until exit)
        try:
            fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            stream.close()
            raise UserError(
                f"pipeline {self.path.stem}: another launcher is running it "
                f"(it holds {self.path.with_suffix('.lock')})"
            ) from None
        stream.seek(0)
        stream.truncate()
        stream.write(f"{os.getpid()}\n")
        stream.flush()
        self._lock = stream
