"""OpenPAI's REST API v2 over plain HTTP (the standard library), with paiexp's retry policy.

Requests carry ``Authorization: Bearer <token>``. Errors are JSON ``{code, message}``.
5xx, 429 and dropped connections are retried with capped, jittered backoff; 401/403 become one
line naming ``OPENPAI_TOKEN``; anything else the server refuses is :class:`OpenPaiRejected`.
The token never appears in a message, a log line or a file.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paiexp.backends.base import BackendUnavailable
from paiexp.errors import UserError
from paiexp.util.retry import RetryPolicy, call_with_retries

TOKEN_VARIABLE = "OPENPAI_TOKEN"
LIST_LIMIT = 1000  # jobs per listing (the server's default is 5000)


class OpenPaiRejected(UserError):
    """The rest-server refused a request (bad protocol, unknown virtual cluster, no job...)."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class OpenPaiUnavailable(BackendUnavailable):
    """5xx or dropped connections went on past the retry budget."""


class _Transient(Exception):
    """A 5xx, a 429 or no response at all: worth another try."""


@dataclass(frozen=True)
class Cluster:
    """Where the rest-server and the web portal are, and who we are there."""

    rest_server_uri: str
    web_portal_uri: str
    user: str
    token: str
    token_source: str  # how to fix a refused token: the variable or the alias file


class OpenPaiApi:
    def __init__(self, cluster: Cluster, policy: RetryPolicy, timeout: float) -> None:
        self.cluster = cluster
        self.policy = policy
        self.timeout = timeout
        self.requests = 0  # HTTP requests sent, retries included

    # -- jobs ------------------------------------------------------------------------------

    def submit(self, protocol_yaml: str) -> bool:
        """POST the job protocol; True when created, False when the name exists (409)."""
        try:
            self.call("POST", "/api/v2/jobs", body=protocol_yaml.encode(), yaml=True)
        except OpenPaiRejected as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def list_jobs(self, keyword: str) -> list[dict[str, Any]]:
        """The user's jobs (those whose name contains ``keyword``, where the server filters:
        older ones return them all), newest first, in one request."""
        query = {"username": self.cluster.user, "limit": str(LIST_LIMIT)}
        if keyword:
            query["keyword"] = keyword
        jobs = self.call("GET", "/api/v2/jobs", query=query)
        return list(jobs.get("data", []) if isinstance(jobs, dict) else jobs)

    def get_job(self, framework: str) -> dict[str, Any] | None:
        """The job's detail (``GET /api/v2/jobs/{user}~{name}``); None if there is none."""
        try:
            job: dict[str, Any] = self.call("GET", f"/api/v2/jobs/{_quote(framework)}")
        except OpenPaiRejected as exc:
            if exc.status == 404:
                return None
            raise
        return job

    def stop(self, framework: str) -> None:
        self.call(
            "PUT", f"/api/v2/jobs/{_quote(framework)}/executionType", json_body={"value": "STOP"}
        )

    def log_locations(self, framework: str, attempt: int, role: str, index: int) -> dict[str, str]:
        """Log name (``all``, ``stdout``, ``stderr``...) -> URI, for the first attempt of a task
        (paiexp sets no taskRetryCount) in job attempt ``attempt``; {} before it started."""
        path = (
            f"/api/v2/jobs/{_quote(framework)}/attempts/{attempt}/taskRoles/{_quote(role)}"
            f"/taskIndex/{index}/attempts/0/logs"
        )
        try:
            found = self.call("GET", path)
        except OpenPaiRejected as exc:
            if exc.status == 404:
                return {}
            raise
        return {item["name"]: item["uri"] for item in found.get("locations") or []}

    def read_log(self, uri: str) -> bytes:
        """A log location's content; a relative URI is on the web portal's host."""
        url = urllib.parse.urljoin(self.cluster.web_portal_uri.rstrip("/") + "/", uri)
        data: bytes = self._retrying("GET", url, None, {}, "read log", raw=True)
        return data

    # -- the cluster -----------------------------------------------------------------------

    def virtual_clusters(self) -> list[str]:
        return sorted(self.call("GET", "/api/v2/virtual-clusters"))

    def storages(self) -> list[str]:
        found = self.call("GET", "/api/v2/storages")
        return sorted(item["name"] for item in found.get("storages") or [])

    # -- requests --------------------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: bytes | None = None,
        yaml: bool = False,
        json_body: Any = None,
    ) -> Any:
        """One API call (retried when transient); its JSON reply."""
        url = self.cluster.rest_server_uri.rstrip("/") + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Authorization": f"Bearer {self.cluster.token}", "Accept": "application/json"}
        if json_body is not None:
            body, headers["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        elif yaml:
            headers["Content-Type"] = "text/yaml"
        return self._retrying(method, url, body, headers, f"{method} {path}", raw=False)

    def _retrying(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        what: str,
        *,
        raw: bool,
    ) -> Any:
        def once() -> Any:
            status, data = self._send(method, url, body, headers)
            if status >= 500 or status == 429:
                raise _Transient(f"HTTP {status} {_error(data)[0]}".strip())
            if status >= 400:
                raise self._refused(status, data, what)
            return data if raw else (json.loads(data) if data.strip() else None)

        try:
            return call_with_retries(
                once,
                policy=self.policy,
                transient=lambda exc: isinstance(exc, _Transient),
                what=f"OpenPAI {what}",
            )
        except _Transient as exc:
            raise OpenPaiUnavailable(
                f"OpenPAI {what} still failing after {self.policy.attempts} attempts: {exc}"
            ) from None

    def _send(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        self.requests += 1
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise _Transient(f"no response ({type(reason).__name__}: {reason})") from None

    def _refused(self, status: int, data: bytes, what: str) -> UserError:
        code, message = _error(data)
        if status in (401, 403):
            return UserError(
                f"OpenPAI at {self.cluster.rest_server_uri} refused the token of user "
                f"{self.cluster.user!r} ({status} {code}: {message}); check "
                f"{self.cluster.token_source}"
            )
        return OpenPaiRejected(f"OpenPAI {what} rejected: {status} {code}: {message}", status, code)


def _error(data: bytes) -> tuple[str, str]:
    """The ``code`` and first line of ``message`` of an error reply."""
    try:
        reply = json.loads(data)
    except ValueError:
        text = data.decode(errors="replace").strip()
        return "", text.splitlines()[0][:300] if text else ""
    if not isinstance(reply, dict):
        return "", ""
    lines = str(reply.get("message") or "").strip().splitlines()
    return str(reply.get("code") or ""), lines[0][:300] if lines else ""


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="~")
