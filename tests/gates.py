"""Jobs held running until a test lets them end: tests/synthetic/job.py's ``$GATES``.

With ``GATES`` naming a directory, each synthetic job makes ``ID.held`` there once its steps
are done and ends only once the test makes ``ID.open``: a test makes "X happens while jobs
run" (an outage, a kill) happen by construction, not by hoping a job is slow enough.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import wait_until


class Gates:
    """The gates of one test's jobs, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory

    def env(self) -> dict[str, str]:
        """What a launcher's environment needs for its jobs to be held."""
        return {"GATES": str(self.directory)}

    def held(self) -> list[Path]:
        """The jobs held now (their ``.held`` files): those whose gate is not open."""
        return [
            path for path in self.directory.glob("*.held") if not path.with_suffix(".open").exists()
        ]

    def opened(self) -> list[Path]:
        """The jobs let end so far (their ``.held`` files)."""
        return [path.with_suffix(".held") for path in self.directory.glob("*.open")]

    def wait_held(self, count: int, timeout: float = 120) -> list[Path]:
        """Wait until exactly ``count`` jobs are held, and return them."""

        def held() -> list[Path] | None:
            jobs = self.held()
            return jobs if len(jobs) == count else None

        return wait_until(held, timeout, f"{count} jobs to be held at their gates")

    @staticmethod
    def pid(job: Path) -> int:
        """The pid of the held job ``job`` (its Python process)."""
        return int(job.read_text())

    @staticmethod
    def open(jobs: list[Path]) -> None:
        """Let ``jobs`` (as :meth:`held` returned them) end."""
        for job in jobs:
            job.with_suffix(".open").touch()

    @contextmanager
    def all_open(self) -> Iterator[None]:
        """Within the block, every job held, now or later, is let end at once."""
        done = threading.Event()

        def opener() -> None:
            while not done.wait(0.05):
                self.open(self.held())

        thread = threading.Thread(target=opener, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


@contextmanager
def cleaned_up(gates: Gates, launchers: list[subprocess.Popen[Any]]) -> Iterator[None]:
    """Whatever happens in the block, no launcher runs on and no job waits for ever."""
    try:
        yield
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
        gates.open(gates.held())
