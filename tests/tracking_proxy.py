"""A tracking server that goes away at an exact point: an HTTP proxy in front of a real
``mlflow server`` that forwards every call until one matches a rule, lets that call reach the
server whole or in part, and from then on answers nothing (connections closed unanswered,
as a server that died), until the test brings it back.

This makes "the server stopped right after some of a run's points were written" a fact a
test sets up, not a race it hopes to win.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from emulator.http_server import ServiceHttpServer

Rule = Callable[[str, dict[str, Any]], bool]  # (path, JSON body) -> cut here


@dataclass
class Cut:
    """Where the server goes away: at the first call ``rule`` matches, of whose metrics only
    the first ``keep`` reach the server (None: the whole call does)."""

    rule: Rule
    keep: int | None = None


class TrackingProxy:
    """``uri`` forwards to ``upstream`` until :meth:`cut_at`'s call; :meth:`restore` ends
    the outage."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.cut: Cut | None = None
        self.down = threading.Event()
        self.lock = threading.Lock()
        self.server = ServiceHttpServer(("127.0.0.1", 0), _handler(self))
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def cut_at(self, cut: Cut) -> None:
        self.cut = cut

    def restore(self) -> None:
        self.cut = None
        self.down.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.close_connections()
        self.server.server_close()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        """The upstream's answer to one call: (status, headers, body)."""
        connection = http.client.HTTPConnection(self.upstream.netloc, timeout=60)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def decide(self, path: str, body: bytes) -> tuple[bytes | None, bool]:
        """(what to forward, or None: nothing; whether to answer the caller)."""
        with self.lock:
            if self.down.is_set():
                return None, False
            cut = self.cut
            if cut is None or not body:
                return body, True
            try:
                call = json.loads(body)
            except ValueError:
                return body, True
            if not isinstance(call, dict) or not cut.rule(path, call):
                return body, True
            self.down.set()
            if cut.keep is not None:
                call = {"run_id": call["run_id"], "metrics": call.get("metrics", [])[: cut.keep]}
            return json.dumps(call).encode(), False


def _handler(proxy: TrackingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            forwarded, answer = proxy.decide(self.path, body)
            result = None
            if forwarded is not None:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Content-Length"] = str(len(forwarded))
                result = proxy.forward(self.command, self.path, headers, forwarded)
            if not answer or result is None:
                self.close_connection = True  # the caller hears nothing back
                return
            status, headers, content = result
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = relay

    return Handler


@contextmanager
def tracking_proxy(upstream: str) -> Iterator[TrackingProxy]:
    proxy = TrackingProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()


def trial_points(path: str, call: dict[str, Any]) -> bool:
    """A call that logs a trial's step series (the ``loss`` of tests/synthetic/job.py)."""
    metrics = call.get("metrics") or []
    return path.endswith("/runs/log-batch") and any(m.get("key") == "loss" for m in metrics)
