"""The webhook notifier against a real HTTP server in a thread."""

from __future__ import annotations

import base64
import os
from datetime import timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from standardwebhooks import Webhook

from slawatch.clock import Clock
from slawatch.config.notifiers import WebhookConfig
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due, deliver_notifier
from slawatch.delivery.notifiers.webhook import WebhookNotifier, verify
from slawatch.errors import DeliveryError
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED, overdue_orders, shown_deliveries, shown_statuses
from tests.receivers import Reply, WebhookReceiver, closed_port

SECRET = "whsec_" + base64.b64encode(os.urandom(24)).decode()
ALERT = {
    "id": "order_unshipped:1:e1:n1",
    "rule": "order_unshipped",
    "key": "1",
    "episode": 1,
    "n": 1,
    "severity": "warning",
    "deadline": "2026-03-01T12:00:00Z",
    "due_at": "2026-03-03T12:00:00Z",
    "fired_at": "2026-03-03T12:00:01Z",
    "row": {"id": 1},
    "description": "",
}
# What the receiver sees does not depend on the outbox's shape: the tests that deliver
# from the outbox run with each (docs/explanation/outbox-rows.md).
SHAPES = pytest.mark.parametrize("outbox", ["alerts", "rows"])


def webhook(url: str, **fields: Any) -> WebhookNotifier:
    config = WebhookConfig.model_validate({"name": "hook", "type": "webhook", "url": url} | fields)
    return WebhookNotifier(config)


@pytest.fixture
def pool(dsn: str) -> Any:
    with Database(dsn, size=2, timeout=10) as p:
        yield p


def test_signed_per_standard_webhooks(receiver: WebhookReceiver) -> None:
    hook = webhook(receiver.url, secret=SECRET, headers={"x-team": "ops"})
    hook.send([ALERT])
    (request,) = receiver.requests
    # The reference implementation of the spec verifies what we sent.
    assert Webhook(SECRET).verify(request.body, request.headers) == {"alerts": [ALERT]}
    assert request.headers["x-team"] == "ops"
    assert request.headers["content-type"] == "application/json"
    # A tampered body does not verify.
    tampered = request.body.replace(b"warning", b"info")
    with pytest.raises(Exception, match="signature"):
        Webhook(SECRET).verify(tampered, request.headers)
    # Our documented receiver-side check agrees with the reference implementation.
    assert verify(SECRET, request.headers, request.body)
    assert not verify(SECRET, request.headers, tampered)
    other = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    assert not verify(other, request.headers, request.body)
    hook.close()


def test_a_retried_batch_keeps_its_webhook_id(receiver: WebhookReceiver) -> None:
    hook = webhook(receiver.url)
    hook.send([ALERT])
    hook.send([ALERT])
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert "webhook-signature" not in first.headers  # no secret, no signature
    hook.close()


@SHAPES
def test_batches_of_the_notifier_size(
    conn: Conn, pool: Any, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    overdue_orders(conn, 250, "hook", outbox)
    hook = webhook(receiver.url, batch=100)
    with freeze_time(CLAIMED):
        assert deliver_due(pool, {"hook": hook}, Clock()).sent == 250
    assert [len(r.alerts) for r in receiver.requests] == [100, 100, 50]
    assert sorted(receiver.alert_ids) == sorted(f"order_unshipped:{k}:e1:n1" for k in range(1, 251))
    hook.close()


@SHAPES
def test_receiver_failing_three_times_then_recovering_gets_everything(
    conn: Conn, pool: Any, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    overdue_orders(conn, 5, "hook", outbox)
    receiver.replies = [Reply(500), Reply(503), Reply(502)]
    hook = webhook(receiver.url)
    with freeze_time(CLAIMED) as clock:
        for _ in range(3):
            assert deliver_notifier(pool, hook, Clock()).retried == 5
            clock.tick(timedelta(minutes=1))
        assert deliver_notifier(pool, hook, Clock()).sent == 5
    assert len(receiver.requests) == 4
    assert sorted(receiver.requests[-1].alerts, key=lambda a: a["id"]) == sorted(
        receiver.requests[0].alerts, key=lambda a: a["id"]
    )
    assert shown_statuses(conn) == {"sent": 5}
    hook.close()


@SHAPES
def test_410_makes_the_deliveries_dead_at_once(
    conn: Conn, pool: Any, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    overdue_orders(conn, 2, "hook", outbox)
    receiver.default = Reply(410)
    hook = webhook(receiver.url)
    with freeze_time(CLAIMED):
        assert deliver_notifier(pool, hook, Clock()).dead == 2
    assert shown_statuses(conn) == {"dead": 2}
    assert {d.last_error for d in shown_deliveries(conn)} == {"HTTP 410 Gone"}
    assert len(receiver.requests) == 1
    hook.close()


@pytest.mark.parametrize(
    ("status", "permanent"),
    [(400, True), (404, True), (408, False), (429, False), (500, False), (503, False)],
)
def test_which_statuses_are_permanent(
    receiver: WebhookReceiver, status: int, permanent: bool
) -> None:
    receiver.default = Reply(status)
    hook = webhook(receiver.url)
    with pytest.raises(DeliveryError) as exc:
        hook.send([ALERT])
    assert exc.value.permanent is permanent
    hook.close()


@SHAPES
def test_a_slow_receiver_times_out_and_is_retried(
    conn: Conn, pool: Any, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    overdue_orders(conn, 1, "hook", outbox)
    receiver.replies = [Reply(200, delay=2.0)]
    hook = webhook(receiver.url, timeout="1s")
    with freeze_time(CLAIMED) as clock:
        assert deliver_notifier(pool, hook, Clock()).retried == 1
        (delivery,) = shown_deliveries(conn)
        assert delivery.last_error is not None
        assert delivery.last_error.startswith("timed out after 1s")
        clock.tick(timedelta(minutes=1))
        assert deliver_notifier(pool, hook, Clock()).sent == 1
    hook.close()


@SHAPES
def test_retry_after_seconds_is_honoured(
    conn: Conn, pool: Any, receiver: WebhookReceiver, outbox: Outbox
) -> None:
    overdue_orders(conn, 1, "hook", outbox)
    receiver.replies = [Reply(429, {"Retry-After": "42"})]
    hook = webhook(receiver.url)
    with freeze_time(CLAIMED):
        assert deliver_notifier(pool, hook, Clock()).retried == 1
    (delivery,) = shown_deliveries(conn)
    assert delivery.next_attempt_at == CLAIMED + timedelta(seconds=42)
    hook.close()


def test_unreachable_receiver_retries_and_never_shows_the_secret() -> None:
    port = closed_port()
    hook = webhook(f"http://user:pw-s3cret@127.0.0.1:{port}/hook", secret=SECRET)
    with pytest.raises(DeliveryError) as exc:
        hook.send([ALERT])
    assert not exc.value.permanent
    assert SECRET not in str(exc.value) and "s3cret" not in str(exc.value)
    hook.close()


def test_https_with_a_private_ca(tmp_path: Any) -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    with WebhookReceiver(tls=server_ctx) as tls_receiver:
        hook = webhook(tls_receiver.url, ca_file=str(tmp_path / "ca.pem"))
        hook.send([ALERT])
        assert tls_receiver.alert_ids == [ALERT["id"]]
        hook.close()
        untrusting = webhook(tls_receiver.url)  # the system's CAs do not know this one
        with pytest.raises(DeliveryError) as exc:
            untrusting.send([ALERT])
        assert not exc.value.permanent
        said = str(exc.value)
        assert said.startswith("ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED]"), said
        assert said.endswith(f"(POST {tls_receiver.url.removesuffix('hook')}…)"), said
        untrusting.close()


# Secrets a webhook URL and its headers carry, each distinct so a leak names its source.
USER_PW = "pw-userinfo-s3cret"
PATH_SECRET = "XpathS3cretXpathS3cret"
QUERY_TOKEN = "tok-query-s3cret"
BEARER = "bearer-header-s3cret"
API_KEY = "key-header-s3cret"
LEAKS = [USER_PW, PATH_SECRET, QUERY_TOKEN, BEARER, API_KEY, SECRET]


def secret_url(port: int, userinfo: bool = False) -> str:
    auth = f"ops:{USER_PW}@" if userinfo else ""
    return f"http://{auth}127.0.0.1:{port}/services/T01/B02/{PATH_SECRET}?token={QUERY_TOKEN}"


def assert_no_secret(text: str) -> None:
    # The Basic header httpx builds from the URL's userinfo is the password, encoded.
    basic = base64.b64encode(f"ops:{USER_PW}".encode()).decode()
    for secret in [*LEAKS, basic]:
        assert secret not in text, f"{secret!r} leaked: {text}"


@SHAPES
@pytest.mark.parametrize("status", [401, 404])
def test_an_echoing_receiver_never_gets_a_secret_into_the_error(
    conn: Conn, pool: Any, receiver: WebhookReceiver, status: int, outbox: Outbox
) -> None:
    """The receiver's error page repeats the request's headers and path + query, raw and
    decoded; neither the DeliveryError nor the delivery's last error shows a secret."""
    overdue_orders(conn, 1, "hook", outbox)
    receiver.default = Reply(status, echo=True)
    port = int(receiver.url.split(":")[2].split("/")[0])
    headers = {"Authorization": f"Bearer {BEARER}", "x-api-key": API_KEY, "x-team": "ops"}
    hook = webhook(secret_url(port), secret=SECRET, headers=headers)
    with pytest.raises(DeliveryError) as exc:
        hook.send([ALERT])
    echoed = receiver.requests[-1]
    assert echoed.headers["authorization"] == f"Bearer {BEARER}"  # the secrets did go out
    assert PATH_SECRET in echoed.path and QUERY_TOKEN in echoed.path
    message = str(exc.value)
    assert_no_secret(message)
    assert message.startswith(f"HTTP {status} ")
    assert "path: /… " in message  # the receiver's words stay, the secrets go
    with freeze_time(CLAIMED):
        assert deliver_notifier(pool, hook, Clock()).dead == 1
    (delivery,) = shown_deliveries(conn)
    error = delivery.last_error
    assert error is not None
    assert_no_secret(error)
    assert "x-team: ops" in error
    hook.close()


def test_an_echoed_userinfo_is_scrubbed_in_every_form(receiver: WebhookReceiver) -> None:
    receiver.default = Reply(401, echo=True)
    port = int(receiver.url.split(":")[2].split("/")[0])
    hook = webhook(secret_url(port, userinfo=True))
    with pytest.raises(DeliveryError) as exc:
        hook.send([ALERT])
    # httpx's Basic auth from the URL's userinfo, percent-decoded
    basic = base64.b64encode(f"ops:{USER_PW}".encode()).decode()
    assert receiver.requests[-1].headers["authorization"] == f"Basic {basic}"
    assert_no_secret(str(exc.value))
    hook.close()


def test_a_secret_cut_by_the_length_limit_is_still_scrubbed(receiver: WebhookReceiver) -> None:
    """Error text is cut to ~200 characters; cutting first would keep a secret's head."""
    receiver.default = Reply(400, body=b"x" * 185 + BEARER.encode())
    hook = webhook(receiver.url, headers={"Authorization": f"Bearer {BEARER}"})
    with pytest.raises(DeliveryError) as exc:
        hook.send([ALERT])
    assert BEARER[:8] not in str(exc.value), str(exc.value)
    hook.close()


def test_a_closed_port_with_credentials_in_the_url_shows_only_scheme_host_and_port() -> None:
    port = closed_port()
    hook = webhook(
        secret_url(port, userinfo=True), secret=SECRET, headers={"Authorization": BEARER}
    )
    with pytest.raises(DeliveryError) as exc:
        hook.send([ALERT])
    assert not exc.value.permanent
    assert_no_secret(str(exc.value))
    assert str(exc.value).startswith("ConnectError: [Errno 111] Connection refused")
    assert str(exc.value).endswith(f"(POST http://127.0.0.1:{port}/…)")  # where it failed
    # What an operator may see of the URL.
    assert hook.scrub(f"POST {secret_url(port, True)} failed") == (
        f"POST http://127.0.0.1:{port}/… failed"
    )
    hook.close()


def test_a_huge_retry_after_is_capped_at_retry_max(receiver: WebhookReceiver) -> None:
    receiver.default = Reply(429, {"Retry-After": "9" * 40})
    hook = webhook(receiver.url, retry={"max": "5m"})
    with pytest.raises(DeliveryError) as exc:
        hook.send([ALERT])
    assert exc.value.retry_after == 300
    hook.close()


def test_an_answer_sent_a_byte_at_a_time_is_cut_at_the_timeout() -> None:
    """httpx's timeout bounds each read: a receiver dribbling its answer would hold the
    worker past its lease (and the batch would be sent again elsewhere)."""
    import socket
    import threading
    import time

    from slawatch.config.notifiers import WebhookConfig
    from slawatch.delivery.notifiers.webhook import WebhookNotifier
    from slawatch.errors import DeliveryError

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def dribble() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 60\r\n\r\n")
            while not stop.wait(0.3):
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    config = WebhookConfig.model_validate(
        {"name": "slow", "type": "webhook", "url": url, "timeout": "1s"}
    )
    notifier = WebhookNotifier(config)
    started = time.monotonic()
    try:
        with pytest.raises(DeliveryError, match="timed out after 1s"):
            notifier.send([ALERT])
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        notifier.close()
        server.close()


def test_batches_go_over_one_kept_alive_connection() -> None:
    """An accepted answer is read, so its connection goes back to the pool: unread,
    httpx closed it, and every batch paid for a new connection (a TLS handshake, and a
    new thread or process at many receivers)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    peers: list[tuple[str, int]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keeps the connection open unless told otherwise

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            peers.append(self.client_address)
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    ).start()
    notifier = webhook(f"http://127.0.0.1:{server.server_address[1]}/hook")
    try:
        for _ in range(3):
            notifier.send([ALERT])
    finally:
        notifier.close()
        server.shutdown()
        server.server_close()
    assert len(peers) == 3 and len(set(peers)) == 1, peers


@pytest.mark.parametrize("dribble", [False, True], ids=["stalled", "dribbled"])
def test_an_accepted_answer_whose_body_never_comes_is_still_accepted(dribble: bool) -> None:
    """Reading an accepted answer (for the connection's sake) is bounded by the timeout,
    whether the body stalls or comes a byte at a time, and a failure there is no failure
    of the delivery: the receiver said 2xx."""
    import socket
    import threading
    import time

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\nnot all")
            while not stop.wait(0.3):
                try:
                    if dribble:
                        conn.sendall(b"x")
                except OSError:
                    return

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    config = WebhookConfig.model_validate(
        {"name": "stall", "type": "webhook", "url": url, "timeout": "1s"}
    )
    notifier = WebhookNotifier(config)
    started = time.monotonic()
    try:
        assert notifier.post(url, b"{}") == 200
        assert time.monotonic() - started < 5
    finally:
        stop.set()
        notifier.close()
        server.close()
