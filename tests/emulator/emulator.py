"""One emulated Alibaba Cloud account: an OSS server and a PAI server over one object store."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .common import Credentials, FaultPlan, RequestLog
from .oss_server import OssServer
from .pai_server import PaiServer
from .store import ObjectStore


class Emulator:
    """OSS + PAI on 127.0.0.1 sharing a store, the credentials, a request log and a fault plan.

    ``local_images`` (a PAI image URI, or ``default`` for any, -> a local Docker image) runs
    every job in a container of that image with ``/ml`` laid out as on PAI; without it, jobs
    run as host processes. ``faults`` is live: change it in place
    (``emulator.faults.rate = 0.2``) or assign a new plan
    (``emulator.faults = FaultPlan(rate=1.0, kinds=("throttle",))``); both servers follow.
    """

    def __init__(
        self,
        root: Path,
        credentials: Credentials | None = None,
        faults: FaultPlan | None = None,
        phase_seconds: float = 0.05,
        bucket: str = "paiexp-test",
        region: str = "cn-hangzhou",
        workspace_id: str = "ws-emulator",
        *,
        host: str = "127.0.0.1",
        pai_port: int = 0,
        oss_port: int = 0,
        image_allow: str | None = None,
        local_images: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.credentials = credentials or Credentials()
        self.bucket = bucket
        self.region = region
        self.workspace_id = workspace_id
        self.log = RequestLog()
        self.store = ObjectStore(self.root / "oss")
        self._faults = faults or FaultPlan()
        self.oss = OssServer(self.store, self.credentials, self.log, self._faults, host, oss_port)
        self.pai = PaiServer(
            self.store,
            self.credentials,
            self.log,
            self._faults,
            root=self.root / "pai",
            phase_seconds=phase_seconds,
            host=host,
            port=pai_port,
            region=region,
            image_allow=image_allow,
            local_images=local_images,
        )

    @property
    def faults(self) -> FaultPlan:
        return self._faults

    @faults.setter
    def faults(self, plan: FaultPlan) -> None:
        self._faults = self.oss.faults = self.pai.faults = plan

    @property
    def default_image(self) -> str:
        """An official image jobs can use: XGBoost 1.6.0 CPU in this region."""
        return str(self.pai.images[0]["ImageUri"])

    def jobs(self) -> list[dict[str, Any]]:
        """Every PAI job as GetTrainingJob shows it, oldest first."""
        return self.pai.jobs()

    def job(self, training_job_id: str) -> dict[str, Any]:
        return self.pai.job(training_job_id)

    @property
    def pai_endpoint(self) -> str:
        """``127.0.0.1:PORT`` for ``Config(endpoint=..., protocol="http")``."""
        return self.pai.endpoint

    @property
    def oss_endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` for ``oss2.Bucket(auth, endpoint, bucket)``."""
        return self.oss.endpoint

    def start(self) -> Emulator:
        self.store.create_bucket(self.bucket)
        self.oss.start()
        self.pai.start()
        return self

    def stop(self) -> None:
        self.pai.stop()
        self.oss.stop()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
