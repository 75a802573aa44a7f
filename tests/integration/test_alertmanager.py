"""The Alertmanager notifier against a local ``/api/v2/alerts`` that validates and merges
alerts as Alertmanager does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.notifiers import AlertmanagerConfig
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due, deliver_notifier
from slawatch.delivery.notifiers.alertmanager import AlertmanagerNotifier
from slawatch.errors import DeliveryError
from tests.integration.helpers import Conn
from tests.integration.test_deliver import CLAIMED
from tests.integration.test_pagerduty import OUTBOXES, last_errors, overdue_orders, statuses
from tests.receivers import Reply
from tests.services import AlertmanagerService, make_alert

FIRST = datetime(2026, 3, 3, 12, 0, 5, tzinfo=UTC)  # just after make_alert's fired_at


@pytest.fixture
def am() -> Iterator[AlertmanagerService]:
    with AlertmanagerService() as s:
        yield s


def notifier(url: str, **fields: Any) -> AlertmanagerNotifier:
    config = {"name": "am", "type": "alertmanager", "url": url}
    return AlertmanagerNotifier(AlertmanagerConfig.model_validate(config | fields))


def test_an_episode_is_one_alert_that_its_resolved_notice_ends(am: AlertmanagerService) -> None:
    manager = notifier(am.url, labels={"team": "ops"})
    with freeze_time(FIRST) as clock:
        manager.send([make_alert("1042", n=1)])
        (alert,) = am.active()
        assert alert.labels == {
            "alertname": "order_unshipped",
            "rule": "order_unshipped",
            "key": "1042",
            "episode": "1",
            "severity": "warning",
            "team": "ops",
        }
        assert alert.annotations == {
            "summary": "order_unshipped: key 1042 overdue since 2026-03-03T12:00:00Z",
            "description": "Paid orders not shipped within 48 hours",
            "id": "order_unshipped:1042:e1:n1",
            "n": "1",
            "row": '{"id": "1042", "status": "paid"}',
            "deadline": "2026-03-01T12:00:00Z",
            "due_at": "2026-03-03T12:00:00Z",
        }
        assert alert.starts_at == datetime(2026, 3, 3, 12, tzinfo=UTC)  # when it fell due
        assert alert.ends_at == FIRST + timedelta(hours=24)  # firing_for
        # Alertmanager would end an alert without endsAt after its resolve_timeout (5m);
        # between slawatch's notifications it stays active.
        clock.tick(timedelta(hours=6))
        assert len(am.active()) == 1
        # The re-notification updates the same alert.
        manager.send([make_alert("1042", n=2)])
        (alert,) = am.alerts.values()
        assert alert.annotations["n"] == "2"
        assert alert.starts_at == datetime(2026, 3, 3, 12, tzinfo=UTC)
        # The resolved notice ends it.
        clock.move_to(datetime(2026, 3, 4, 8, 0, 5, tzinfo=UTC))
        manager.send([make_alert("1042", status="resolved")])
        assert am.active() == []
        (alert,) = am.alerts.values()
        assert alert.ends_at == datetime(2026, 3, 4, 8, tzinfo=UTC)
        # The row's next episode is a new alert.
        manager.send([make_alert("1042", episode=2)])
        (active,) = am.active()
        assert active.labels["episode"] == "2"
        assert len(am.alerts) == 2
    manager.close()


def test_a_resolved_notice_in_the_same_batch_goes_after_the_firing_one(
    am: AlertmanagerService,
) -> None:
    manager = notifier(am.url)
    with freeze_time(datetime(2026, 3, 4, 8, 0, 5, tzinfo=UTC)):
        manager.send([make_alert("5", status="resolved"), make_alert("5")])
        assert am.active() == []
    manager.close()


def test_generator_url_links_back_with_the_values_encoded(am: AlertmanagerService) -> None:
    link = "https://slawatch.example/alerts?rule={rule}&key={key}"
    manager = notifier(am.url, generator_url=link)
    manager.send([make_alert("a b/c&d")])
    (alert,) = am.alerts.values()
    assert alert.generator_url == (
        "https://slawatch.example/alerts?rule=order_unshipped&key=a%20b%2Fc%26d"
    )
    manager.close()


def test_a_deadline_of_minus_infinity_and_a_huge_row(am: AlertmanagerService) -> None:
    always = make_alert("9", row={"note": "x" * 100_000}) | {"deadline": None, "due_at": None}
    manager = notifier(am.url)
    with freeze_time(FIRST):
        manager.send([always])
    (alert,) = am.alerts.values()
    assert alert.starts_at == datetime(2026, 3, 3, 12, 0, 1, tzinfo=UTC)  # fired_at
    assert "deadline" not in alert.annotations and "due_at" not in alert.annotations
    assert len(alert.annotations["row"]) == 8192
    manager.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_batches_from_the_outbox_are_one_post_each(
    conn: Conn, db: Database, am: AlertmanagerService, outbox: Outbox
) -> None:
    overdue_orders(conn, 250, "am", outbox)
    manager = notifier(am.url)
    with freeze_time(CLAIMED):
        assert deliver_due(db, {"am": manager}, Clock()).sent == 250
        assert [len(json.loads(r.body)) for r in am.requests] == [100, 100, 50]
        assert sorted(int(a.labels["key"]) for a in am.active()) == list(range(1, 251))
    assert statuses(conn) == {"sent": 250}
    manager.close()


@pytest.mark.parametrize(
    ("reply", "permanent", "wait"),
    [
        (Reply(400, body=b'"start time must be before end time"'), True, None),
        (Reply(422, body=b'{"code":422}'), True, None),
        (Reply(429, {"Retry-After": "15"}), False, 15),
        (Reply(500), False, None),
        (Reply(503), False, None),
    ],
)
def test_alertmanagers_answers(
    am: AlertmanagerService, reply: Reply, permanent: bool, wait: float | None
) -> None:
    am.replies = [reply]
    manager = notifier(am.url)
    with pytest.raises(DeliveryError) as exc:
        manager.send([make_alert()])
    assert (exc.value.permanent, exc.value.retry_after) == (permanent, wait)
    manager.close()


@pytest.mark.parametrize("outbox", OUTBOXES)
def test_credentials_in_the_url_and_headers_never_show(
    conn: Conn, db: Database, am: AlertmanagerService, outbox: Outbox
) -> None:
    overdue_orders(conn, 1, "am", outbox)
    url = am.url.replace("http://", "http://ops:pw-am-s3cret@") + "/prefix?token=tok-am-s3cret"
    manager = notifier(url, headers={"Authorization": "Bearer bearer-am-s3cret"})
    am.replies = [Reply(401, body=f"denied {url} Bearer bearer-am-s3cret".encode())]
    with freeze_time(CLAIMED):
        assert deliver_notifier(db, manager, Clock()).dead == 1
    (error,) = last_errors(conn)
    assert "s3cret" not in error, error
    assert error.startswith("HTTP 401 Unauthorized: denied http://127.0.0.1:")
    assert am.requests[0].path == "/prefix/api/v2/alerts?token=tok-am-s3cret"
    manager.close()


def test_the_service_refuses_what_alertmanager_refuses(am: AlertmanagerService) -> None:
    manager = notifier(am.url)
    good = {"labels": {"alertname": "x"}, "startsAt": "2026-03-03T12:00:00Z"}
    bad = [
        (good | {"endsAt": "2026-03-03T11:00:00Z"}, 400),  # ends before it starts
        ({"labels": {"alertname": ""}}, 400),  # empty labels are dropped: none left
        ({"labels": {"bad-name": "x"}}, 400),
        ({"annotations": {}}, 422),  # labels are required
        (good | {"startsAt": "yesterday"}, 422),
        (good | {"labels": {"n": 1}}, 422),  # label values are strings
    ]
    for alert, status in bad:
        with pytest.raises(DeliveryError, match=f"HTTP {status}"):
            manager.post(manager.url, json.dumps([alert]).encode())
    manager.post(manager.url, json.dumps([good]).encode())
    assert len(am.alerts) == 1
    manager.close()
