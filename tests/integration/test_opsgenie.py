"""The Opsgenie notifier against a local Alert API v2 that keeps alerts by alias."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.notifiers import OpsgenieConfig
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due, deliver_notifier
from slawatch.delivery.notifiers.opsgenie import OpsgenieNotifier
from slawatch.errors import DeliveryError
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED
from tests.integration.test_pagerduty import OUTBOXES, last_errors, overdue_orders, statuses
from tests.receivers import Reply
from tests.services import OpsgenieService, make_alert

KEY = OpsgenieService.KEY


@pytest.fixture
def og() -> Iterator[OpsgenieService]:
    with OpsgenieService() as s:
        yield s


def notifier(url: str, **fields: Any) -> OpsgenieNotifier:
    config = {"name": "og", "type": "opsgenie", "api_key": KEY, "url": url}
    return OpsgenieNotifier(OpsgenieConfig.model_validate(config | fields))


def test_an_episode_is_one_alert_that_its_resolved_notice_closes(og: OpsgenieService) -> None:
    genie = notifier(og.base, source="shop-db", tags=["shop"])
    genie.send([make_alert("1042", n=1, severity="critical")])
    (create,) = og.creates
    assert create["alias"] == "order_unshipped:1042:e1"
    assert create["message"] == "order_unshipped: key 1042 overdue"
    assert create["priority"] == "P1"
    assert (create["source"], create["entity"]) == ("shop-db", "order_unshipped")
    assert create["tags"] == ["slawatch", "order_unshipped", "critical", "shop"]
    assert create["description"] == (
        "Overdue since 2026-03-03T12:00:00Z (episode 1, notification 1)\n"
        'Paid orders not shipped within 48 hours\n{"id": "1042", "status": "paid"}'
    )
    assert create["details"]["id"] == "order_unshipped:1042:e1:n1"
    assert create["details"]["row"] == '{"id": "1042", "status": "paid"}'
    # A re-notification of the episode raises the open alert's count: no second alert.
    genie.send([make_alert("1042", n=2, severity="critical")])
    (alert,) = og.alerts
    assert (alert.status, alert.count) == ("open", 2)
    # The resolved notice closes it, by alias.
    genie.send([make_alert("1042", status="resolved")])
    assert og.closes == [
        (
            "order_unshipped:1042:e1",
            {"source": "shop-db", "note": "Resolved: episode over by 2026-03-04T08:00:00Z"},
        )
    ]
    assert [a.status for a in og.alerts] == ["closed"]
    # The row's next episode is a new alert.
    genie.send([make_alert("1042", episode=2)])
    assert [(a.alias, a.status) for a in og.alerts] == [
        ("order_unshipped:1042:e1", "closed"),
        ("order_unshipped:1042:e2", "open"),
    ]
    genie.close()


def test_priorities_come_from_severities(og: OpsgenieService) -> None:
    severities = ["info", "warning", "critical"]
    genie = notifier(og.base)
    genie.send([make_alert(str(i), severity=s) for i, s in enumerate(severities)])
    assert [c["priority"] for c in og.creates] == ["P5", "P3", "P1"]
    genie.close()
    # A partial mapping keeps the defaults for the rest.
    genie = notifier(og.base, priorities={"warning": "P2"})
    genie.send([make_alert(str(i), severity=s, episode=2) for i, s in enumerate(severities)])
    assert [c["priority"] for c in og.creates[3:]] == ["P5", "P2", "P1"]
    genie.close()


def test_a_close_in_the_same_batch_goes_after_the_create(og: OpsgenieService) -> None:
    genie = notifier(og.base)
    genie.send([make_alert("5", status="resolved"), make_alert("5", n=1)])
    assert [r.path.split("?")[0] for r in og.requests] == [
        "/v2/alerts",
        "/v2/alerts/order_unshipped%3A5%3Ae1/close",
    ]
    assert [a.status for a in og.alerts] == ["closed"]
    genie.close()


def test_huge_values_fit_opsgenies_limits_and_odd_keys_still_close(og: OpsgenieService) -> None:
    """A 10 kB key (hashed into the alias), a key with '/', '?' and '#' (one path
    segment), 10 kB descriptions and rows: Opsgenie takes them, and each closes."""
    huge = "k" * 10_000
    odd = "a/b?c=d#e f"
    genie = notifier(og.base)
    genie.send(
        [
            make_alert(huge, description="d" * 20_000, row={"note": huge}),
            make_alert(odd, row={"note": huge}),
        ]
    )
    genie.send([make_alert(huge, status="resolved"), make_alert(odd, status="resolved")])
    assert [a.status for a in og.alerts] == ["closed", "closed"]
    assert len(og.alerts[0].alias) <= 512
    assert og.alerts[1].alias == f"order_unshipped:{odd}:e1"
    assert len(og.creates[0]["message"]) == 130
    assert len(og.creates[0]["description"]) == 15_000
    genie.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_batches_from_the_outbox_one_request_per_alert(
    conn: Conn, db: Database, og: OpsgenieService, outbox: Outbox
) -> None:
    overdue_orders(conn, 25, "og", outbox)
    genie = notifier(og.base)  # batch 20 by default
    with freeze_time(CLAIMED):
        assert deliver_due(db, {"og": genie}, Clock()).sent == 25
    assert sorted(a.alias for a in og.alerts) == sorted(
        f"order_unshipped:{k}:e1" for k in range(1, 26)
    )
    assert statuses(conn) == {"sent": 25}
    genie.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_a_refused_alert_is_dead_at_once_and_the_key_never_shows(
    conn: Conn,
    db: Database,
    og: OpsgenieService,
    caplog: pytest.LogCaptureFixture,
    outbox: Outbox,
) -> None:
    overdue_orders(conn, 1, "og", outbox)
    # Opsgenie's 422, here repeating the request's key (as a proxy's error page might).
    answer = {"message": "validation error", "errors": {"auth": f"GenieKey {KEY}"}}
    og.replies = [Reply(422, body=json.dumps(answer).encode())]
    genie = notifier(og.base)
    with freeze_time(CLAIMED), caplog.at_level(logging.DEBUG):
        assert deliver_notifier(db, genie, Clock()).dead == 1
    (error,) = last_errors(conn)
    assert error.startswith('HTTP 422 Unprocessable Entity: {"message": "validation error"')
    assert "GenieKey ***" in error
    assert KEY not in error
    # slawatch's own lines (logs.py keeps httpx's, which show the URL, at WARNING).
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("slawatch"))
    assert "dead" in logged and KEY not in logged
    assert statuses(conn) == {"dead": 1}
    genie.close()


def test_a_wrong_key_is_dead(og: OpsgenieService) -> None:
    genie = notifier(og.base, api_key="0b5c3f9e-wrong-key-0000")
    with pytest.raises(DeliveryError, match="HTTP 401") as exc:
        genie.send([make_alert()])
    assert exc.value.permanent
    assert og.alerts == []
    genie.close()


@pytest.mark.parametrize(
    ("reply", "permanent", "wait"),
    [
        (Reply(429, {"Retry-After": "20"}), False, 20),
        (Reply(429), False, None),
        (Reply(500), False, None),
        (Reply(503), False, None),
        (Reply(422), True, None),
        (Reply(404), True, None),
    ],
)
def test_opsgenies_answers(
    og: OpsgenieService, reply: Reply, permanent: bool, wait: float | None
) -> None:
    og.replies = [reply]
    genie = notifier(og.base)
    with pytest.raises(DeliveryError) as exc:
        genie.send([make_alert()])
    assert (exc.value.permanent, exc.value.retry_after) == (permanent, wait)
    genie.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_a_failure_mid_batch_names_the_request_and_the_batch_is_retried_whole(
    conn: Conn, db: Database, og: OpsgenieService, outbox: Outbox
) -> None:
    overdue_orders(conn, 3, "og", outbox)
    og.replies = [Reply(202, body=b"{}"), Reply(503)]
    genie = notifier(og.base)
    with freeze_time(CLAIMED) as clock:
        assert deliver_notifier(db, genie, Clock()).retried == 3
        (error,) = last_errors(conn)
        assert error.startswith("HTTP 503 Service Unavailable [request 2 of 3, order_unshipped:")
        clock.tick(60)
        assert deliver_notifier(db, genie, Clock()).sent == 3
    # The scripted 202 stood in for Opsgenie (which kept nothing of it): the retry
    # made one alert per episode.
    assert sorted((a.alias, a.count) for a in og.alerts) == [
        (f"order_unshipped:{k}:e1", 1) for k in (1, 2, 3)
    ]
    assert statuses(conn) == {"sent": 3}
    genie.close()


def test_one_timeout_bounds_the_whole_batch(og: OpsgenieService) -> None:
    og.replies = [Reply(202, delay=0.6, body=b"{}") for _ in range(3)]
    genie = notifier(og.base, timeout="1s")
    started = time.monotonic()
    with pytest.raises(DeliveryError, match="timed out after 1s") as exc:
        genie.send([make_alert(str(k)) for k in range(3)])
    assert time.monotonic() - started < 1.5
    assert not exc.value.permanent
    genie.close()


def test_the_service_refuses_what_opsgenie_refuses(og: OpsgenieService) -> None:
    genie = notifier(og.base)
    good = {"message": "m", "alias": "a", "priority": "P3"}
    bad = [
        {"alias": "a"},
        good | {"message": "m" * 131},
        good | {"alias": "a" * 513},
        good | {"description": "d" * 15_001},
        good | {"priority": "P6"},
        good | {"tags": ["t" * 51]},
        good | {"details": {"n": 1}},
    ]
    for body in bad:
        with pytest.raises(DeliveryError, match="HTTP 422") as exc:
            genie.post(genie.url, json.dumps(body).encode())
        assert exc.value.permanent
    genie.post(genie.url, json.dumps(good).encode())
    assert len(og.creates) == 1
    genie.close()


def test_the_eu_instance_is_the_url() -> None:
    config = OpsgenieConfig.model_validate(
        {"name": "og", "type": "opsgenie", "api_key": KEY, "url": "https://api.eu.opsgenie.com"}
    )
    genie = OpsgenieNotifier(config)
    assert genie.url == "https://api.eu.opsgenie.com/v2/alerts"
    assert KEY not in repr(config)
    genie.close()
