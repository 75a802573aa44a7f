"""The webhook notifier against a real HTTP server in a thread."""

from __future__ import annotations

import base64
import os
from datetime import timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from psycopg_pool import ConnectionPool
from standardwebhooks import Webhook

from slawatch.clock import Clock
from slawatch.deliver import deliver_batch, deliver_due
from slawatch.errors import DeliveryError
from slawatch.notifiers import WebhookConfig
from slawatch.notifiers.webhook import WebhookNotifier, verify
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED, overdue_orders, statuses
from tests.receivers import Reply, WebhookReceiver, closed_port, receiver

__all__ = ["receiver"]

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


def webhook(url: str, **fields: Any) -> WebhookNotifier:
    config = WebhookConfig.model_validate({"name": "hook", "type": "webhook", "url": url} | fields)
    return WebhookNotifier(config)


@pytest.fixture
def pool(dsn: str) -> Any:
    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as p:
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


def test_batches_of_the_notifier_size(conn: Conn, pool: Any, receiver: WebhookReceiver) -> None:
    overdue_orders(conn, 250, "hook")
    hook = webhook(receiver.url, batch=100)
    with freeze_time(CLAIMED):
        assert deliver_due(pool, {"hook": hook}, Clock()).sent == 250
    assert [len(r.alerts) for r in receiver.requests] == [100, 100, 50]
    assert sorted(receiver.alert_ids) == sorted(f"order_unshipped:{k}:e1:n1" for k in range(1, 251))
    hook.close()


def test_receiver_failing_three_times_then_recovering_gets_everything(
    conn: Conn, pool: Any, receiver: WebhookReceiver
) -> None:
    overdue_orders(conn, 5, "hook")
    receiver.replies = [Reply(500), Reply(503), Reply(502)]
    hook = webhook(receiver.url)
    with freeze_time(CLAIMED) as clock:
        for _ in range(3):
            assert deliver_batch(pool, hook, Clock()).retried == 5
            clock.tick(timedelta(minutes=1))
        assert deliver_batch(pool, hook, Clock()).sent == 5
    assert len(receiver.requests) == 4
    assert sorted(receiver.requests[-1].alerts, key=lambda a: a["id"]) == sorted(
        receiver.requests[0].alerts, key=lambda a: a["id"]
    )
    assert statuses(conn) == {"sent": 5}
    hook.close()


def test_410_makes_the_deliveries_dead_at_once(
    conn: Conn, pool: Any, receiver: WebhookReceiver
) -> None:
    overdue_orders(conn, 2, "hook")
    receiver.default = Reply(410)
    hook = webhook(receiver.url)
    with freeze_time(CLAIMED):
        assert deliver_batch(pool, hook, Clock()).dead == 2
    assert statuses(conn) == {"dead": 2}
    (error,) = conn.execute("SELECT DISTINCT last_error FROM slawatch.delivery").fetchone()
    assert error == "HTTP 410 Gone"
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


def test_a_slow_receiver_times_out_and_is_retried(
    conn: Conn, pool: Any, receiver: WebhookReceiver
) -> None:
    overdue_orders(conn, 1, "hook")
    receiver.replies = [Reply(200, delay=2.0)]
    hook = webhook(receiver.url, timeout="1s")
    with freeze_time(CLAIMED) as clock:
        assert deliver_batch(pool, hook, Clock()).retried == 1
        (error,) = conn.execute("SELECT last_error FROM slawatch.delivery").fetchone()
        assert error.startswith("timed out after 1s")
        clock.tick(timedelta(minutes=1))
        assert deliver_batch(pool, hook, Clock()).sent == 1
    hook.close()


def test_retry_after_seconds_is_honoured(conn: Conn, pool: Any, receiver: WebhookReceiver) -> None:
    overdue_orders(conn, 1, "hook")
    receiver.replies = [Reply(429, {"Retry-After": "42"})]
    hook = webhook(receiver.url)
    with freeze_time(CLAIMED):
        assert deliver_batch(pool, hook, Clock()).retried == 1
    (nxt,) = conn.execute("SELECT next_attempt_at FROM slawatch.delivery").fetchone()
    assert nxt == CLAIMED + timedelta(seconds=42)
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
        with pytest.raises(DeliveryError, match="CERTIFICATE_VERIFY_FAILED") as exc:
            untrusting.send([ALERT])
        assert not exc.value.permanent
        untrusting.close()
