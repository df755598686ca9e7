"""A flaky tracking server for fault checks: an HTTP proxy in front of a real ``mlflow server`` that answers MLflow
errors for a while, then forwards again (:class:`FlakyProxy`). The load test's fault phase
(:mod:`orchestrate.tools.loadtest`) and the outbox's fault tests put it between the clients and the server.

What it answers during a fault phase, request after request in turn, is a list of :class:`Fault`: an HTTP status and
the JSON body MLflow's server would send (``{"error_code": "BAD_REQUEST", "message": ...}``, what a database error
other than OperationalError gives, e.g. a connection-pool timeout), either instead of forwarding (the server never
saw the request) or after forwarding it (``forward=True``: the server did the work but the answer was lost, so the
client sends it again). Everything else is forwarded unchanged. Standard library only (``http.server``,
``http.client``), one thread per connection.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                        "transfer-encoding", "upgrade", "content-length", "host"})
UPSTREAM_TIMEOUT_S = 120.0  # MLflow's own client timeout


@dataclass(frozen=True)
class Fault:
    """One faulty answer: HTTP ``status`` with MLflow's JSON error ``error_code``; ``forward``: send the request to
    the server first and drop its answer (the work is done, the client is told it failed)."""

    status: int
    error_code: str
    forward: bool = False

    def body(self) -> bytes:
        return json.dumps({"error_code": self.error_code,
                           "message": f"flaky proxy: {self.error_code} (HTTP {self.status})"}).encode()


# What MLflow's server answers for a database error other than OperationalError (400 BAD_REQUEST, e.g. a
# connection-pool timeout), before or after the work was done; and for an OperationalError (503
# TEMPORARILY_UNAVAILABLE), an unexpected error (500 INTERNAL_ERROR), a gateway in front of it that timed out (502).
DATABASE_ERRORS = (Fault(400, "BAD_REQUEST"), Fault(400, "BAD_REQUEST", forward=True))
SERVER_ERRORS = (Fault(503, "TEMPORARILY_UNAVAILABLE"), Fault(500, "INTERNAL_ERROR", forward=True),
                 Fault(502, "BAD_GATEWAY", forward=True))
TRANSIENT_FAULTS = DATABASE_ERRORS + SERVER_ERRORS


class FlakyProxy:
    """``with FlakyProxy("http://127.0.0.1:5000") as proxy:`` listens on ``proxy.uri`` (127.0.0.1, a free port) and
    forwards to the upstream server; :meth:`fail` starts a fault phase. ``faulted`` and ``forwarded`` count the
    requests answered with a fault and those the server saw."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream {upstream!r} is not an http:// server address (e.g. http://127.0.0.1:5000)")
        self.upstream = (parsed.hostname, parsed.port or 80)
        self._lock = threading.Lock()
        self._faults: tuple[Fault, ...] = ()
        self._until = 0.0
        self._turn = 0
        self.faulted = 0
        self.forwarded = 0
        self.by_status: dict[int, int] = {}
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def uri(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FlakyProxy":
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="flaky-proxy", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "FlakyProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def fail(self, seconds: float, faults: Sequence[Fault] = TRANSIENT_FAULTS) -> None:
        """For the next ``seconds``, answer every API request with the next of ``faults`` in turn."""
        if not faults:
            raise ValueError("fail() needs at least one Fault")
        with self._lock:
            self._faults, self._turn = tuple(faults), 0
            self._until = time.monotonic() + seconds

    def heal(self) -> None:
        """End the fault phase now."""
        with self._lock:
            self._until = 0.0

    @property
    def failing(self) -> bool:
        return time.monotonic() < self._until

    def next_fault(self, path: str) -> Fault | None:
        """The fault this request gets (None: forward it)."""
        if not path.startswith(("/api/", "/ajax-api/")):
            return None
        with self._lock:
            if time.monotonic() >= self._until or not self._faults:
                return None
            fault = self._faults[self._turn % len(self._faults)]
            self._turn += 1
            self.faulted += 1
            self.by_status[fault.status] = self.by_status.get(fault.status, 0) + 1
            return fault

    def forward(self, method: str, path: str, headers: list[tuple[str, str]],
                body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send one request to the upstream server: (status, headers, body) of its answer."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.request(method, path, body=body or None,
                         headers={k: v for k, v in headers if k.lower() not in HOP_BY_HOP})
            r = conn.getresponse()
            data = r.read()
            with self._lock:
                self.forwarded += 1
            return r.status, [(k, v) for k, v in r.getheaders() if k.lower() not in HOP_BY_HOP], data
        finally:
            conn.close()


def _handler(proxy: FlakyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as MLflow's client session expects

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: tests and the load test
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _proxy(self) -> None:
            body = self._body()
            fault = proxy.next_fault(self.path)
            if fault is None or fault.forward:
                try:
                    answer = proxy.forward(self.command, self.path, list(self.headers.items()), body)
                except (OSError, http.client.HTTPException) as e:
                    answer = (502, [("Content-Type", "text/plain")], f"flaky proxy: upstream: {e}".encode())
                if fault is None:
                    self._answer(*answer)
                    return
            self._answer(fault.status, [("Content-Type", "application/json")], fault.body())

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _proxy

    return Handler
