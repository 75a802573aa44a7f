"""The HTTP notifiers' transport (slawatch/delivery/notifiers/http.py, wire.py): POSTs go
straight to kept-alive sockets yet keep what httpx.Client gave them: the same bytes on
the wire, proxies from the environment, the connect timeout, no redirects, the answer
limit, gzip and chunked answers, kept-alive connections closed by close(), not used
again once the receiver closed them or said it would. Real servers in threads
throughout."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx
import pytest

from slawatch import __version__
from slawatch.config.notifiers import WebhookConfig, tls_context
from slawatch.delivery.notifiers import wire
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.errors import DeliveryError
from tests.integration.test_webhook import ALERT
from tests.receivers import Reply, WebhookReceiver
from tests.waiting import wait_until

BODY = b'{"alerts":[]}'


def webhook(url: str, **fields: Any) -> WebhookNotifier:
    config = WebhookConfig.model_validate({"name": "hook", "type": "webhook", "url": url} | fields)
    return WebhookNotifier(config)


def refused(notifier: WebhookNotifier) -> DeliveryError:
    """The error ``notifier`` raises sending one alert (it must raise one); closed after."""
    try:
        with pytest.raises(DeliveryError) as exc:
            notifier.send([ALERT])
    finally:
        notifier.close()
    return exc.value


class RawServer:
    """Records each request exactly as it came (head and body), answers 200 and keeps
    the connection; ``closed`` counts connections the client closed. With ``hang_up``
    it closes each connection after its answer (``hung_up`` counts them), as a receiver
    does whose idle timeout ran out."""

    def __init__(
        self, host: str = "127.0.0.1", answer: bytes | None = None, hang_up: bool = False
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, 0), family=family)
        self.port = self.listener.getsockname()[1]
        self.answer = answer or b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self.hang_up = hang_up
        self.hung_up = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        self.closed += 1
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(data) < length:
                    data += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                conn.sendall(self.answer)
                if self.hang_up:
                    conn.shutdown(socket.SHUT_RDWR)
                    self.hung_up += 1
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize(
    ("host", "path", "config_headers", "headers"),
    [
        # percent-encoding of the path and query as httpx does it, a header of the
        # notifier replacing the Client's, a request's header replacing the notifier's
        (
            "127.0.0.1",
            "/services/a b/%2F?q=1 2&x=ä&y=%41",
            {"X-Team": "ops", "User-Agent": "theirs/1"},
            {"x-team": "sre", "Authorization": "Bearer t0ken"},
        ),
        # the URL's credentials as Basic auth, over the request's own Authorization
        ("ops:p%40ss%20w@127.0.0.1", "/hook", {}, {"Authorization": "Bearer t0ken"}),
        ("[::1]", "/hook?x=1", {}, {}),  # IPv6: Host [::1]:port
        # a Host of its own; a header named in another case is sent twice, as httpx does
        ("127.0.0.1", "/hook", {"Host": "hooks.example.com"}, {"Content-Type": "text/plain"}),
    ],
    ids=["encoding", "userinfo", "ipv6", "host"],
)
def test_the_pool_sends_the_bytes_the_client_sent(
    host: str, path: str, config_headers: dict[str, str], headers: dict[str, str]
) -> None:
    server = RawServer(host.rpartition("@")[2].strip("[]"))
    url = f"http://{host}:{server.port}{path}"
    # What HttpNotifier.post sent through httpx.Client before the pool.
    client = httpx.Client(
        timeout=10,
        verify=tls_context(None),
        headers={"user-agent": f"slawatch/{__version__}", **config_headers},
        follow_redirects=False,
    )
    notifier = webhook(url, headers=config_headers)
    try:
        answer = client.post(
            url, content=BODY, headers={"content-type": "application/json"} | headers
        )
        assert answer.status_code == 200
        assert notifier.post(url, BODY, headers) == 200
        assert notifier.route(url) is not None  # the pool's path, not the Client's
    finally:
        client.close()
        notifier.close()
        server.close()
    by_client, by_pool = server.requests
    assert by_pool == by_client
    if "@" in host:
        assert b"\r\nAuthorization: Basic b3BzOnBAc3Mgdw==\r\n" in by_pool  # ops:p@ss w


def test_close_closes_the_kept_alive_connection() -> None:
    server = RawServer()
    notifier = webhook(f"http://127.0.0.1:{server.port}/hook")
    try:
        for _ in range(3):
            notifier.send([ALERT])
        assert (server.connections, len(server.requests), server.closed) == (1, 3, 0)
        notifier.close()
        wait_until(lambda: server.closed == 1, "the notifier's connection closed")
    finally:
        server.close()


def test_a_connection_the_receiver_closed_while_idle_is_not_used_again() -> None:
    """A kept-alive connection the receiver closed since its last answer (without
    ``Connection: close``) is seen closed before it is used: the next POST goes on a new
    one instead of failing on the old."""
    server = RawServer(hang_up=True)
    notifier = webhook(f"http://127.0.0.1:{server.port}/hook")
    try:
        notifier.send([ALERT])
        wait_until(lambda: server.hung_up == 1, "the receiver closed the connection")
        notifier.send([ALERT])
        assert (server.connections, len(server.requests)) == (2, 2)
    finally:
        notifier.close()
        server.close()


@pytest.mark.parametrize(
    ("answer", "connections"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 2),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 1),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", 1),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", 2),
    ],
    ids=["connection-close", "chunked", "informational", "http-1.0"],
)
def test_a_connection_is_kept_after_an_answer_read_to_its_end(
    answer: bytes, connections: int
) -> None:
    """Accepted either way; the connection kept for the next POST only where HTTP/1.1
    keeps it: not after ``Connection: close`` or an HTTP/1.0 answer; an informational
    answer (1xx) is passed over for the one that follows."""
    server = RawServer(answer=answer)
    notifier = webhook(f"http://127.0.0.1:{server.port}/hook")
    try:
        notifier.send([ALERT])
        notifier.send([ALERT])
        assert (server.connections, len(server.requests)) == (connections, 2)
    finally:
        notifier.close()
        server.close()


def test_a_chunked_error_answer_is_read_whole() -> None:
    server = RawServer(
        answer=b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"b\r\nbusy, try l\r\n5;x=1\r\nater.\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    notifier = webhook(f"http://127.0.0.1:{server.port}/hook")
    try:
        error = refused(notifier)
    finally:
        server.close()
    assert str(error) == "HTTP 503 Busy: busy, try later."
    assert not error.permanent


def test_an_answer_sent_before_the_request_was_read_whole_is_read() -> None:
    """A receiver that answers 413 after the head and closes: the client's write of the
    rest fails, and the answer is read all the same (as httpcore read it), not an error
    of the write."""
    server = socket.create_server(("127.0.0.1", 0))

    def refuse() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n"
                b"Connection: close\r\n\r\ntoo big!"
            )

    threading.Thread(target=refuse, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    notifier = webhook(url)
    try:
        with pytest.raises(DeliveryError) as exc:
            notifier.post(url, b"x" * 8_000_000)  # more than the socket buffers take
    finally:
        notifier.close()
        server.close()
    assert str(exc.value) == "HTTP 413 Payload Too Large: too big!"
    assert exc.value.permanent


class ForwardingProxy:
    """An HTTP proxy in a thread: takes the absolute-form request a client sends a
    proxy, records its target, forwards it and answers with the server's answer."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy.seen.append(self.path)
                body = self.rfile.read(int(self.headers["content-length"]))
                target = urlsplit(self.path)
                assert target.hostname is not None
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
                skip = {"proxy-connection", "connection", "content-length"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                upstream.request("POST", target.path or "/", body, headers)
                answer = upstream.getresponse()
                content = answer.read()
                upstream.close()
                self.send_response(answer.status)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ForwardingProxy]:
    """A forwarding proxy, and an environment that names none until the test does."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    p = ForwardingProxy()
    yield p
    p.close()


@pytest.mark.parametrize(
    ("env", "proxied"),
    [
        ({"HTTP_PROXY": "{proxy}"}, True),
        ({"ALL_PROXY": "{proxy}"}, True),
        ({"HTTP_PROXY": "{proxy}", "NO_PROXY": "127.0.0.1"}, False),
        ({"HTTPS_PROXY": "{proxy}"}, False),  # an http:// target
        ({}, False),
    ],
    ids=["http_proxy", "all_proxy", "no_proxy", "https_proxy", "none"],
)
def test_a_proxy_from_the_environment_carries_the_alert(
    proxy: ForwardingProxy,
    receiver: WebhookReceiver,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    proxied: bool,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(proxy=proxy.url))
    notifier = webhook(receiver.url, headers={"x-team": "ops"})
    try:
        notifier.send([ALERT])
        notifier.send([ALERT])
    finally:
        notifier.close()
    assert receiver.alert_ids == [ALERT["id"]] * 2
    assert receiver.requests[0].headers["x-team"] == "ops"
    assert proxy.seen == ([receiver.url] * 2 if proxied else [])


def test_a_redirect_is_an_error_and_not_followed(receiver: WebhookReceiver) -> None:
    with WebhookReceiver() as elsewhere:
        receiver.default = Reply(302, {"Location": elsewhere.url})
        error = refused(webhook(receiver.url))
        assert str(error) == "HTTP 302 Found"
        assert not error.permanent
        assert len(receiver.requests) == 1 and elsewhere.requests == []


def test_a_connect_that_gets_no_answer_times_out() -> None:
    """A listener whose backlog is full: the kernel drops further SYNs unanswered."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = socket.create_connection(full.getsockname())
    notifier = webhook(f"http://127.0.0.1:{full.getsockname()[1]}/hook", timeout="1s")
    started = time.monotonic()
    try:
        with pytest.raises(DeliveryError) as exc:
            notifier.send([ALERT])
    finally:
        notifier.close()
        queued.close()
        full.close()
    assert str(exc.value) == "timed out after 1s (ConnectTimeout)"
    assert not exc.value.permanent
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("status", [200, 500])
def test_an_endless_answer_is_read_up_to_the_limit_only(status: int) -> None:
    """An answer that never ends (chunked, sent as fast as it goes): what fits in 64 KB
    is read, then the connection dropped, long before the 10 s timeout."""
    server = socket.create_server(("127.0.0.1", 0))

    def endless() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            chunk = b"1000\r\n" + b"x" * 4096 + b"\r\n"
            try:
                while True:
                    conn.sendall(chunk)
            except OSError:
                return

    threading.Thread(target=endless, daemon=True).start()
    notifier = webhook(f"http://127.0.0.1:{server.getsockname()[1]}/hook", timeout="10s")
    started = time.monotonic()
    try:
        if status == 200:
            notifier.send([ALERT])
        else:
            with pytest.raises(DeliveryError, match=r"^HTTP 500 X: x{190}"):
                notifier.send([ALERT])
    finally:
        notifier.close()
        server.close()
    assert time.monotonic() - started < 5


def test_a_gzipped_error_answer_is_read_decoded(receiver: WebhookReceiver) -> None:
    """The Client asks for gzip and deflate (Accept-Encoding); an error page so sent
    shows as its text."""
    receiver.default = Reply(
        400, {"Content-Encoding": "gzip"}, body=gzip.compress(b"invalid_payload: no text")
    )
    error = refused(webhook(receiver.url))
    assert str(error) == "HTTP 400 Bad Request: invalid_payload: no text"
    assert error.permanent
    assert receiver.requests[0].headers["accept-encoding"] == "gzip, deflate"


class Dripper:
    """A receiver that answers with ``answer`` and then ``drip``, a byte every 50 ms, for
    at most 30 s, then closes: the head never ends (or the trailers never do)."""

    def __init__(self, answer: bytes, drip: bytes) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()
        self.answer, self.drip = answer, drip
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(self.answer)
            for byte in (self.drip * 1000)[:600]:
                if self.stop.wait(0.05):
                    return
                conn.sendall(bytes([byte]))

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@pytest.mark.parametrize(
    ("answer", "drip", "sent"),
    [
        (b"HTTP/1.1 200 OK\r\n", b"X-Slow: a\r\n", False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n", b"X-T: 1\r\n", True),
        (b"", b"HTTP/1.1 100 Continue\r\n\r\n", False),
    ],
    ids=["head", "trailers", "informational"],
)
def test_an_answer_dripped_a_byte_at_a_time_is_bounded_by_the_timeout(
    answer: bytes, drip: bytes, sent: bool
) -> None:
    """The whole exchange is bounded by the notifier's timeout (1 s here), however the
    receiver drips its answer: a head that never ends fails the send as timed out; an
    accepted answer whose trailers never end is accepted, its connection dropped. The
    receiver would go on for 30 s."""
    server = Dripper(answer, drip)
    notifier = webhook(f"http://127.0.0.1:{server.server.getsockname()[1]}/hook", timeout="1s")
    started = time.monotonic()
    try:
        if sent:
            notifier.send([ALERT])
        else:
            assert str(refused(notifier)).startswith("timed out after 1s")
    finally:
        notifier.close()
        server.close()
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\n{}\n0\n\n",
    ],
    ids=["bare-lf", "mixed", "folded", "chunked-bare-lf"],
)
def test_an_answer_h11_reads_is_read(answer: bytes) -> None:
    """Line ends without CR and a folded header, which h11 (httpx) reads: the batch is
    accepted once, not timed out waiting for a CRLF and sent again; the connection kept."""
    server = RawServer(answer=answer)
    notifier = webhook(f"http://127.0.0.1:{server.port}/hook", timeout="2s")
    try:
        notifier.send([ALERT])
        notifier.send([ALERT])
        assert (server.connections, len(server.requests)) == (1, 2)
    finally:
        notifier.close()
        server.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 099 Early\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: 1\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n",
    ],
    ids=["version", "status-below-100", "header-name", "chunk-size"],
)
def test_an_answer_h11_refuses_is_refused(answer: bytes) -> None:
    """What h11 refuses is refused here too: a failed send (retried), not a batch taken
    for accepted on an answer httpx would not have read."""
    server = RawServer(answer=answer)
    error = refused(webhook(f"http://127.0.0.1:{server.port}/hook", timeout="2s"))
    server.close()
    assert "RemoteProtocolError" in str(error) and not error.permanent, str(error)


def test_a_tls_handshake_gets_what_is_left_of_the_timeout() -> None:
    """The connection's TLS handshake is bounded by what the TCP connect left of the
    timeout, not by the whole timeout again. The receiver's listen queue is full when
    the client connects, so its first SYN is dropped and the connect takes about a
    second (the kernel's first retransmission); the receiver then never answers the
    handshake. With a timeout of 2 s the send fails at 2 s, not at 3 s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        stop.wait(0.5)
        held.append(listener.accept()[0])  # the filler: the queue has room again
        held.append(listener.accept()[0])  # the notifier's: never a TLS byte
        stop.wait(10)

    threading.Thread(target=serve, daemon=True).start()
    notifier = webhook(f"https://127.0.0.1:{port}/hook", timeout="2s")
    started = time.monotonic()
    try:
        error = refused(notifier)
    finally:
        stop.set()
        for sock in (*held, filler, listener):
            sock.close()
    elapsed = time.monotonic() - started
    assert str(error).startswith("timed out after 2s"), str(error)
    assert elapsed < 2.6, elapsed


@pytest.mark.parametrize(
    "segment", ["XSECRETtoken1234abcdXYZ", "B0123abc", "6f1c2a7e-8d3b-4c5e-9f0a-1b2c3d4e5f60"]
)
def test_a_receiver_echoing_one_part_of_a_secret_path_shows_none_of_it(segment: str) -> None:
    """The path is a secret (Slack's, Teams' URLs), and a receiver may echo one part of
    it in its error: each part that looks like a token is scrubbed, raw and decoded;
    short words stay readable."""
    echoed = f"no such hook: {segment} (services)".encode()
    server = RawServer(
        answer=b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(echoed), echoed)
    )
    error = refused(webhook(f"http://127.0.0.1:{server.port}/services/T0/{segment}"))
    server.close()
    assert segment not in str(error), str(error)
    assert str(error) == "HTTP 404 Not Found: no such hook: … (services)"


def test_an_answer_that_came_while_the_process_was_stopped_is_read() -> None:
    """Past the deadline, what has come already is read (a process stopped while its
    receiver answered: the batch was accepted, and saying so keeps it from being sent
    again), but no more than 64 KiB of it, nor anything that has not come."""
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(answer + b"\r\n")
        late = wire._Answer(ours, time.monotonic() - 5)
        status, _, _, headers = late.head()
        assert (status, b"".join(late.body(status, headers)), late.complete) == (200, b"{}", True)
        # Trailers that never end, all there already: read up to the bound, then a timeout.
        theirs.sendall(answer)
        late = wire._Answer(ours, time.monotonic() - 5)
        status, _, _, headers = late.head()

        def endless() -> None:
            with contextlib.suppress(OSError):  # closed once the client gave up
                theirs.sendall(b"X-T: 1\r\n" * 40_000)

        threading.Thread(target=endless, daemon=True).start()
        with pytest.raises(httpcore.ReadTimeout):
            b"".join(late.body(status, headers))
        assert wire.HEAD_LIMIT < late.late <= wire.HEAD_LIMIT + wire.READ
