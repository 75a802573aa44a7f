"""The PagerDuty notifier against a local Events API v2 that keeps incidents as PagerDuty does."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.notifiers import PagerDutyConfig
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due, deliver_notifier
from slawatch.delivery.notifiers.pagerduty import PagerDutyNotifier
from slawatch.errors import DeliveryError
from slawatch.operate.inspect import stats
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED, overdue_orders
from tests.receivers import Reply
from tests.services import PagerDutyService, make_alert

ROUTING_KEY = "R0UT1NGKEYS3CRETabcdef0123456789"

# The notifier tests that go through the outbox run over both of its shapes
# (docs/explanation/outbox-rows.md): what the receiver gets is the same.
OUTBOXES = ["alerts", "rows"]


def statuses(conn: Conn) -> dict[str, int]:
    """Deliveries by status, counted as `slawatch stats` counts them (a row's send: one
    per alert), whichever shape holds them."""
    counted: dict[str, int] = {}
    for d in stats(conn).deliveries:
        counted[d.status] = counted.get(d.status, 0) + d.deliveries
    return counted


def last_errors(conn: Conn) -> list[str]:
    """The distinct errors kept on the deliveries and the rows' sends."""
    return [
        e
        for (e,) in conn.execute(
            "SELECT last_error FROM slawatch.delivery WHERE last_error IS NOT NULL"
            " UNION SELECT last_error FROM slawatch.outbox_send WHERE last_error IS NOT NULL"
        )
    ]


@pytest.fixture
def pd() -> Iterator[PagerDutyService]:
    with PagerDutyService() as s:
        yield s


def notifier(base_url: str, **fields: Any) -> PagerDutyNotifier:
    config = {"name": "pd", "type": "pagerduty", "routing_key": ROUTING_KEY, "base_url": base_url}
    return PagerDutyNotifier(PagerDutyConfig.model_validate(config | fields))


def test_an_episode_is_one_incident_that_its_resolved_notice_closes(pd: PagerDutyService) -> None:
    pager = notifier(pd.base, source="shop-db")
    pager.send([make_alert("1042", n=1, severity="critical")])
    (trigger,) = pd.events
    assert trigger["routing_key"] == ROUTING_KEY
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == "order_unshipped:1042:e1"
    payload = trigger["payload"]
    assert payload["summary"] == (
        "order_unshipped: key 1042 overdue since 2026-03-03T12:00:00Z "
        "(Paid orders not shipped within 48 hours)"
    )
    assert (payload["source"], payload["severity"]) == ("shop-db", "critical")
    assert payload["timestamp"] == "2026-03-03T12:00:01Z"
    assert payload["custom_details"]["id"] == "order_unshipped:1042:e1:n1"
    assert payload["custom_details"]["row"] == {"id": "1042", "status": "paid"}
    # A re-notification of the episode joins its open incident; it does not open another.
    pager.send([make_alert("1042", n=2, severity="critical")])
    (incident,) = pd.incidents
    assert (incident.status, len(incident.alerts)) == ("triggered", 2)
    # The resolved notice closes it.
    pager.send([make_alert("1042", status="resolved")])
    assert pd.events[-1] == {
        "routing_key": ROUTING_KEY,
        "event_action": "resolve",
        "dedup_key": "order_unshipped:1042:e1",
    }
    assert [i.status for i in pd.incidents] == ["resolved"]
    # The row's next episode is a new incident.
    pager.send([make_alert("1042", episode=2)])
    assert [(i.dedup_key, i.status) for i in pd.incidents] == [
        ("order_unshipped:1042:e1", "resolved"),
        ("order_unshipped:1042:e2", "triggered"),
    ]
    pager.close()


def test_severities_map_to_pagerdutys(pd: PagerDutyService) -> None:
    pager = notifier(pd.base)
    pager.send(
        [make_alert(str(i), severity=s) for i, s in enumerate(["info", "warning", "critical"])]
    )
    assert [e["payload"]["severity"] for e in pd.events] == ["info", "warning", "critical"]
    pager.close()


def test_a_resolve_in_the_same_batch_goes_after_the_trigger(pd: PagerDutyService) -> None:
    """Sent first, the resolve would find nothing open and the trigger would leave an
    incident open for an episode that is over."""
    pager = notifier(pd.base)
    pager.send([make_alert("5", status="resolved"), make_alert("5", n=1)])
    assert [e["event_action"] for e in pd.events] == ["trigger", "resolve"]
    assert [i.status for i in pd.incidents] == ["resolved"]
    pager.close()


def test_huge_values_fit_pagerdutys_limits_and_long_keys_still_resolve(
    pd: PagerDutyService,
) -> None:
    huge = "k" * 10_000
    pager = notifier(pd.base)
    pager.send([make_alert(huge, description="d" * 10_000, row={"note": huge})])
    pager.send([make_alert(huge, status="resolved")])
    (incident,) = pd.incidents
    assert incident.status == "resolved"
    assert len(incident.dedup_key) <= 255
    assert len(pd.events[0]["payload"]["summary"]) == 1024
    pager.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_batches_from_the_outbox_one_event_per_alert(
    conn: Conn, db: Database, pd: PagerDutyService, outbox: Outbox
) -> None:
    overdue_orders(conn, 25, "pd", outbox)
    pager = notifier(pd.base)  # batch 20 by default
    with freeze_time(CLAIMED):
        assert deliver_due(db, {"pd": pager}, Clock()).sent == 25
    assert len(pd.events) == 25
    assert sorted(i.dedup_key for i in pd.incidents) == sorted(
        f"order_unshipped:{k}:e1" for k in range(1, 26)
    )
    assert statuses(conn) == {"sent": 25}
    pager.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_an_invalid_event_is_dead_at_once_and_the_routing_key_never_shows(
    conn: Conn, db: Database, pd: PagerDutyService, outbox: Outbox
) -> None:
    overdue_orders(conn, 1, "pd", outbox)
    # PagerDuty's 400, here repeating the routing key (as a proxy's error page might).
    answer = {
        "status": "invalid event",
        "message": "Event object is invalid",
        "errors": [ROUTING_KEY],
    }
    pd.replies = [Reply(400, body=json.dumps(answer).encode())]
    pager = notifier(pd.base)
    with freeze_time(CLAIMED):
        assert deliver_notifier(db, pager, Clock()).dead == 1
    (error,) = last_errors(conn)
    assert ROUTING_KEY not in error
    assert error.startswith('HTTP 400 Bad Request: {"status": "invalid event"'), error
    assert statuses(conn) == {"dead": 1}
    pager.close()


@pytest.mark.parametrize(
    ("reply", "permanent", "wait"),
    [
        (Reply(429, {"Retry-After": "20"}), False, 20),
        (Reply(429), False, None),
        (Reply(500), False, None),
        (Reply(503), False, None),
        (Reply(404), True, None),
    ],
)
def test_pagerdutys_answers(
    pd: PagerDutyService, reply: Reply, permanent: bool, wait: float | None
) -> None:
    pd.replies = [reply]
    pager = notifier(pd.base)
    with pytest.raises(DeliveryError) as exc:
        pager.send([make_alert()])
    assert (exc.value.permanent, exc.value.retry_after) == (permanent, wait)
    pager.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_a_failure_mid_batch_names_the_event_and_the_batch_is_retried_whole(
    conn: Conn, db: Database, pd: PagerDutyService, outbox: Outbox
) -> None:
    overdue_orders(conn, 3, "pd", outbox)
    pd.replies = [Reply(202, body=b"{}"), Reply(503)]
    pager = notifier(pd.base)
    with freeze_time(CLAIMED) as clock:
        assert deliver_notifier(db, pager, Clock()).retried == 3
        (error,) = last_errors(conn)
        assert error.startswith("HTTP 503 Service Unavailable [event 2 of 3, order_unshipped:")
        clock.tick(60)
        assert deliver_notifier(db, pager, Clock()).sent == 3
    # The first event went twice; PagerDuty folds the repeat into the same incident.
    assert len(pd.incidents) == 3
    assert statuses(conn) == {"sent": 3}
    pager.close()


def test_one_timeout_bounds_the_whole_batch(pd: PagerDutyService) -> None:
    """A batch's lease covers one send: three slow answers must not take three timeouts."""
    pd.replies = [Reply(202, delay=0.6, body=b"{}") for _ in range(3)]
    pager = notifier(pd.base, timeout="1s")
    started = time.monotonic()
    with pytest.raises(DeliveryError, match="timed out after 1s") as exc:
        pager.send([make_alert(str(k)) for k in range(3)])
    assert time.monotonic() - started < 1.5
    assert not exc.value.permanent
    pager.close()


def test_the_service_refuses_what_pagerduty_refuses(pd: PagerDutyService) -> None:
    pager = notifier(pd.base)
    good = {
        "routing_key": ROUTING_KEY,
        "event_action": "trigger",
        "payload": {"summary": "s", "source": "h", "severity": "critical"},
    }
    bad = [
        good | {"routing_key": "short"},
        good | {"event_action": "fire"},
        good | {"payload": {**good["payload"], "severity": "warn"}},  # type: ignore[dict-item]
        good | {"payload": {**good["payload"], "summary": "s" * 1025}},  # type: ignore[dict-item]
        good | {"payload": {"summary": "s", "severity": "info"}},
        {"routing_key": ROUTING_KEY, "event_action": "resolve"},
    ]
    for event in bad:
        with pytest.raises(DeliveryError, match="HTTP 400") as exc:
            pager.post(pager.url, json.dumps(event).encode())
        assert exc.value.permanent
    pager.post(pager.url, json.dumps(good).encode())
    assert len(pd.events) == 1
    pager.close()


def test_a_password_in_the_base_url_never_shows() -> None:
    """A base URL through a proxy with credentials: an error names the host, not them."""
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    pager = notifier(f"http://relay:s3cr3tpass@127.0.0.1:{port}", timeout="2s")
    with pytest.raises(DeliveryError) as exc:
        pager.send([make_alert()])
    pager.close()
    assert "s3cr3tpass" not in pager.scrub(str(exc.value))
    assert "s3cr3tpass" not in str(exc.value)
