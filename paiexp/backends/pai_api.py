"""The PAI control plane through the official generated clients, with paiexp's retry policy.

PaiStudio 2022-01-12 (training jobs) and AIWorkspace 2021-02-04 (images). Requests and
responses are the API's own PascalCase maps. Throttling, 5xx and lost connections are
retried with capped, jittered backoff; anything else the service rejects becomes one clear
line: :class:`PaiRejected` for a request it refuses, a :class:`UserError` for credentials.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from paiexp.backends.base import BackendUnavailable
from paiexp.cloud.credentials import describe_key
from paiexp.errors import UserError
from paiexp.util.outage import describe
from paiexp.util.retry import RetryPolicy, call_with_retries

PAGE_SIZE = 100
AUTH_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidSecurityToken", "Forbidden")


class PaiRejected(UserError):
    """The service refused a request (bad image, instance type, quota, workspace, ...)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class PaiUnavailable(BackendUnavailable):
    """Transient errors went on past the retry budget."""


class PaiApi:
    def __init__(
        self,
        *,
        region: str,
        endpoint: str | None,
        workspace_endpoint: str | None,
        protocol: str,
        credentials: Any,
        policy: RetryPolicy,
        timeout: float,
    ) -> None:
        from alibabacloud_aiworkspace20210204.client import Client as WorkspaceClient
        from alibabacloud_paistudio20220112.client import Client as StudioClient
        from alibabacloud_tea_openapi.utils_models import Config
        from darabonba.runtime import RuntimeOptions

        def config(host: str) -> Any:
            milliseconds = int(timeout * 1000)
            return Config(
                credential=credentials,
                endpoint=host,
                protocol=protocol,
                region_id=region,
                read_timeout=milliseconds,
                connect_timeout=milliseconds,
            )

        self.credentials = credentials
        self.policy = policy
        self.studio = StudioClient(config(endpoint or f"pai.{region}.aliyuncs.com"))
        self.workspace = WorkspaceClient(
            config(workspace_endpoint or endpoint or f"aiworkspace.{region}.aliyuncs.com")
        )
        self.runtime = RuntimeOptions(autoretry=False)
        self.requests = 0  # API calls sent, retries included

    # -- training jobs ---------------------------------------------------------------------

    def create_training_job(
        self, body: Mapping[str, Any], find_existing: Callable[[], str | None]
    ) -> str:
        """CreateTrainingJob; a retry first looks the job up (a lost reply may hide a job)."""
        from alibabacloud_paistudio20220112 import models

        request = models.CreateTrainingJobRequest().from_map(dict(body))
        response = self._call(
            "CreateTrainingJob",
            lambda: self.studio.create_training_job_with_options(request, {}, self.runtime),
            before_retry=find_existing,
        )
        return response if isinstance(response, str) else str(response["TrainingJobId"])

    def list_training_jobs(self, **query: Any) -> tuple[list[dict[str, Any]], int]:
        from alibabacloud_paistudio20220112 import models

        request = models.ListTrainingJobsRequest().from_map(query)
        body = self._call(
            "ListTrainingJobs",
            lambda: self.studio.list_training_jobs_with_options(request, {}, self.runtime),
        )
        return list(body.get("TrainingJobs") or []), int(body.get("TotalCount") or 0)

    def get_training_job(self, job_id: str) -> dict[str, Any]:
        return self._call(
            "GetTrainingJob",
            lambda: self.studio.get_training_job_with_options(job_id, {}, self.runtime),
        )

    def stop_training_job(self, job_id: str) -> None:
        self._call(
            "StopTrainingJob",
            lambda: self.studio.stop_training_job_with_options(job_id, {}, self.runtime),
        )

    def update_labels(self, job_id: str, labels: Mapping[str, str]) -> None:
        from alibabacloud_paistudio20220112 import models

        request = models.UpdateTrainingJobLabelsRequest().from_map(
            {"Labels": [{"Key": k, "Value": v} for k, v in labels.items()]}
        )
        self._call(
            "UpdateTrainingJobLabels",
            lambda: self.studio.update_training_job_labels_with_options(
                job_id, request, {}, self.runtime
            ),
        )

    def list_logs(
        self, job_id: str, page: int, size: int, worker_id: str | None = None
    ) -> tuple[list[str], int]:
        """A page of the job's log (its master's), or of one instance's (``worker_id``)."""
        from alibabacloud_paistudio20220112 import models

        request = models.ListTrainingJobLogsRequest(
            page_number=page, page_size=size, worker_id=worker_id
        )
        body = self._call(
            "ListTrainingJobLogs",
            lambda: self.studio.list_training_job_logs_with_options(
                job_id, request, {}, self.runtime
            ),
        )
        return list(body.get("Logs") or []), int(body.get("TotalCount") or 0)

    def list_metrics(self, job_id: str, page: int, size: int) -> tuple[list[dict[str, Any]], int]:
        """ListTrainingJobMetrics: one page of the job's metric points, oldest first."""
        from alibabacloud_paistudio20220112 import models

        request = models.ListTrainingJobMetricsRequest(
            page_number=page, page_size=size, order="asc"
        )
        body = self._call(
            "ListTrainingJobMetrics",
            lambda: self.studio.list_training_job_metrics_with_options(
                job_id, request, {}, self.runtime
            ),
        )
        return list(body.get("Metrics") or []), int(body.get("TotalCount") or 0)

    def latest_metrics(self, job_id: str) -> dict[str, float]:
        from alibabacloud_paistudio20220112 import models

        request = models.GetTrainingJobLatestMetricsRequest()
        body = self._call(
            "GetTrainingJobLatestMetrics",
            lambda: self.studio.get_training_job_latest_metrics_with_options(
                job_id, request, {}, self.runtime
            ),
        )
        return {m["Name"]: float(m["Value"]) for m in body.get("Metrics") or [] if "Name" in m}

    # -- images ----------------------------------------------------------------------------

    def list_images(self, labels: str, name: str | None, page: int) -> tuple[list[dict], int]:
        from alibabacloud_aiworkspace20210204 import models

        request = models.ListImagesRequest(
            labels=labels, name=name, page_number=page, page_size=PAGE_SIZE, verbose=True
        )
        body = self._call(
            "ListImages",
            lambda: self.workspace.list_images_with_options(request, {}, self.runtime),
        )
        return list(body.get("Images") or []), int(body.get("TotalCount") or 0)

    # -- calls -----------------------------------------------------------------------------

    def _call(
        self,
        action: str,
        call: Callable[[], Any],
        before_retry: Callable[[], Any] | None = None,
    ) -> Any:
        def once() -> Any:
            self.requests += 1
            return call().body.to_map()

        try:
            return call_with_retries(
                once,
                policy=self.policy,
                transient=transient,
                what=f"PAI {action}",
                before_retry=before_retry,
            )
        except Exception as exc:
            raise self._explain(action, exc) from None

    def _explain(self, action: str, exc: Exception) -> Exception:
        status = getattr(exc, "status_code", None) or getattr(exc, "statusCode", None)
        data = getattr(exc, "data", None) or {}
        code = str(data.get("Code") or getattr(exc, "code", "") or "")
        lines = str(data.get("Message") or "").strip().splitlines()
        message = lines[0][:300] if lines else ""  # not the string-to-sign some errors add
        if transient(exc):
            why = f"{code} {message}".strip() if code else describe(exc)
            return PaiUnavailable(
                f"PAI {action} still failing after {self.policy.attempts} attempts: {why}"
            )
        if status in (401, 403) or code.startswith(AUTH_CODES):
            return UserError(
                f"PAI refused {describe_key(self.credentials)} ({code}: {message}); check "
                "ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET and the "
                "workspace's permissions"
            )
        if status is not None:
            return PaiRejected(f"PAI {action} rejected: {code}: {message}", code)
        return exc


def transient(exc: BaseException) -> bool:
    """Worth retrying: throttling, a 5xx, or no response at all."""
    from alibabacloud_tea_openapi.exceptions import (
        ClientException,
        ServerException,
        ThrottlingException,
    )
    from darabonba.exceptions import UnretryableException

    if isinstance(exc, (ThrottlingException, ServerException, UnretryableException)):
        return True
    if isinstance(exc, ClientException):
        code = str(getattr(exc, "code", "") or "")
        return exc.status_code == 429 or code.startswith(("Throttling", "ServiceUnavailable"))
    return False


def parse_time(text: Any) -> float | None:
    """A PAI time (ISO 8601, ``2024-01-01T00:00:00Z``; UTC unless it says) in epoch seconds."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def running_span(job: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """When a job (GetTrainingJob's or ListTrainingJobs' view) first ran and when its last
    status ended, from its ``StatusTransitions``: PAI bills its instances in between."""
    transitions = job.get("StatusTransitions") or []
    running = [t for t in transitions if t.get("Status") == "Running" and t.get("StartTime")]
    ends = [t["EndTime"] for t in transitions if t.get("EndTime")]
    start = parse_time(running[0]["StartTime"]) if running else None
    return start, parse_time(ends[-1]) if ends else None
