"""Real peers for notifier tests: an HTTP server in a thread, service reachability."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import pytest

# Headers every request has: left out of an echo so the interesting ones fit in
# the ~200 characters of a reply that an error message keeps.
ROUTINE = {"host", "accept", "accept-encoding", "connection", "user-agent", "content-length"}


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # Answer with what the request carried (every header, the path and query, raw
    # and decoded), as careless receivers and proxies do in their error pages.
    echo: bool = False
    body: bytes = b""


@dataclass
class Request:
    headers: dict[str, str]
    body: bytes
    path: str = ""

    @property
    def alerts(self) -> list[dict[str, Any]]:
        return list(json.loads(self.body)["alerts"])


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that records each POST and answers from a script.

    ``replies`` are used in order, then ``default`` forever. ``port``: listen there
    (a receiver that comes up where one was down); 0: any free port.
    """

    def __init__(self, tls: ssl.SSLContext | None = None, port: int = 0) -> None:
        self.requests: list[Request] = []
        self.replies: list[Reply] = []
        self.default = Reply()
        self.received = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append(Request(headers, body, self.path))
                receiver.received.set()
                reply = receiver.replies.pop(0) if receiver.replies else receiver.default
                time.sleep(reply.delay)
                answer = reply.body
                if reply.echo:
                    seen = [f"path: {self.path}", f"decoded: {unquote(self.path)}"]
                    seen += [f"{k}: {v}" for k, v in headers.items() if k not in ROUTINE]
                    scheme, _, credentials = headers.get("authorization", "").partition(" ")
                    if scheme.lower() == "basic":
                        seen.append(f"basic: {base64.b64decode(credentials).decode()}")
                    answer = "\n".join(seen).encode()
                try:
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:  # the client gave up (timeout, killed)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/hook"
        # A short poll: shutdown() waits for it (the default 0.5 s, every test's teardown).
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def alert_ids(self) -> list[str]:
        return [a["id"] for r in self.requests for a in r.alerts]


def require_service(name: str, port: int) -> None:
    """Skip when the service is not on 127.0.0.1:port, or fail under SLAWATCH_REQUIRE_SERVICES=1."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return
    except OSError as exc:
        message = f"{name} is not reachable on 127.0.0.1:{port} ({exc})"
    if os.environ.get("SLAWATCH_REQUIRE_SERVICES") == "1":
        pytest.fail(message + " and SLAWATCH_REQUIRE_SERVICES=1")
    pytest.skip(message)


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
