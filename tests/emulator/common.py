"""What the emulator's servers share: the account's credentials, the request log, fault plans."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Literal

Fault = Literal["error", "throttle", "drop"]


@dataclass(frozen=True)
class Credentials:
    """The one AccessKey pair the emulated account accepts (plus an optional STS token)."""

    access_key_id: str = "LTAI-emulator-key-id"
    access_key_secret: str = "emulator-secret-do-not-leak"
    security_token: str | None = None


@dataclass
class FaultPlan:
    """Inject faults into a ``rate`` share of requests (seeded, so a run can be replayed).

    ``error``: HTTP 500/503 with the service's error body, request not processed.
    ``throttle``: the service's throttling error (request not processed).
    ``drop``: the connection is closed without a response; half of these happen *after* the
    request was processed (the client cannot know whether it took effect).
    """

    rate: float = 0.0
    kinds: tuple[Fault, ...] = ("error", "throttle", "drop")
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def draw(self) -> tuple[Fault | None, bool]:
        """The fault for the next request (or None) and whether it strikes after processing."""
        with self._lock:
            if self.rate <= 0 or self._rng.random() >= self.rate:
                return None, False
            kind = self._rng.choice(self.kinds)
            return kind, kind == "drop" and self._rng.random() < 0.5


@dataclass(frozen=True)
class RequestRecord:
    time: float
    service: Literal["pai", "oss"]
    method: str
    path: str  # without the query string
    query: dict[str, str]
    action: str  # PAI: CreateTrainingJob, ...; OSS: PutObject, GetObject, ...
    status: int  # HTTP status sent; 0 when the connection was dropped
    fault: Fault | None = None
    bytes_in: int = 0  # request body size (OSS upload volume)


class RequestLog:
    """Every request either server received, in order; thread-safe."""

    def __init__(self) -> None:
        self._records: list[RequestRecord] = []
        self._lock = threading.Lock()

    def add(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def records(self, service: str | None = None, action: str | None = None) -> list[RequestRecord]:
        with self._lock:
            return [
                r
                for r in self._records
                if service in (None, r.service) and action in (None, r.action)
            ]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
