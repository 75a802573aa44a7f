"""Per-episode order (issue 13): a resolved notice never reaches a receiver before the
firing notifications of its episode are settled, whatever the receiver did meanwhile.

The operator's probe: jobs resolve while their first notification waits to retry (the
receiver answered 500, then recovers). Sent first, the resolve finds nothing open and
the late trigger opens an incident that nothing closes. Each receiver here is the local
stand-in of the real service, keeping state as it does.

Each test runs with each shape of the outbox (``outbox``: SLAWATCH_OUTBOX,
docs/explanation/outbox-rows.md): with rows, a resolved row's send to a notifier waits
for the pending sends there of the firing rows that share a key with it.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from freezegun import freeze_time

from slawatch.clock import Clock
from slawatch.config.notifiers import (
    AlertmanagerConfig,
    PagerDutyConfig,
    SlackConfig,
    WebhookConfig,
)
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import PassResult, deliver_due, replay
from slawatch.delivery.notifiers.alertmanager import AlertmanagerNotifier
from slawatch.delivery.notifiers.base import BaseNotifier
from slawatch.delivery.notifiers.pagerduty import PagerDutyNotifier
from slawatch.delivery.notifiers.slack import SlackNotifier
from slawatch.delivery.notifiers.webhook import WebhookNotifier
from slawatch.engine.claim import ClaimPlan
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.errors import DeliveryError
from tests.integration.helpers import Conn, claim_all, shop
from tests.integration.lifecycle_helpers import Inbox
from tests.receivers import Reply, WebhookReceiver
from tests.services import AlertmanagerService, PagerDutyService, SlackService

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DUE = T0 + 48 * H + S  # order_unshipped: paid at T0, overdue from here
SWEPT = 11 * M  # two claims this far apart see a shipped order's episode end
ENDED = DUE + 2 * SWEPT  # the resolved notices are written by now
RETRY = {"first": "1h", "max": "2h", "attempts": 5}  # the first retry: 48 to 60 min on
RETRIED = DUE + 2 * H  # every notification's retry is due
KEYS = 20
ROUTING_KEY = "R0UT1NGKEYS3CRETabcdef0123456789"


@pytest.fixture(params=["alerts", "rows"])
def outbox(request: pytest.FixtureRequest) -> Outbox:
    """SLAWATCH_OUTBOX of the claims: each test runs with both shapes."""
    return cast(Outbox, request.param)


def resolving(conn: Conn, notifier: str, outbox: Outbox) -> ClaimPlan:
    """order_unshipped with resolved notices, to ``notifier`` only."""
    rule = shop(conn)["order_unshipped"].model_copy(update={"resolve": True, "notify": [notifier]})
    migrate(conn, [rule])
    return prepare(conn, rule, outbox=outbox)


def statuses(conn: Conn) -> dict[str, int]:
    """Alerts by the status of their delivery, in either shape: a row's send counts once
    per element (one alert each)."""
    rows = conn.execute(
        "SELECT status, sum(n)::int FROM ("
        " SELECT status, 1 AS n FROM slawatch.delivery"
        " UNION ALL SELECT s.status, cardinality(r.keys) FROM slawatch.outbox_send s"
        " JOIN slawatch.outbox_row r ON r.id = s.row_id) x GROUP BY 1"
    )
    return dict(rows.fetchall())


def resolved(conn: Conn, outbox: Outbox) -> int:
    """The resolved notices written, all in the shape ``outbox``."""
    (alerts,) = conn.execute(
        "SELECT count(*) FROM slawatch.alert WHERE kind = 'resolved'"
    ).fetchone() or (0,)
    (rows,) = conn.execute(
        "SELECT coalesce(sum(cardinality(keys)), 0) FROM slawatch.outbox_row"
        " WHERE kind = 'resolved'"
    ).fetchone() or (0,)
    assert (alerts if outbox == "rows" else rows) == 0, (alerts, rows)
    return int(alerts + rows)


def deliver(db: Database, notifier: BaseNotifier, at: datetime) -> PassResult:
    with freeze_time(at):
        return deliver_due(db, {notifier.name: notifier}, Clock())


def ended_while_retrying(conn: Conn, db: Database, notifier: BaseNotifier, outbox: Outbox) -> None:
    """KEYS orders notified to ``notifier``, whose receiver fails the first request (the
    caller scripted it); they ship while the notifications wait to retry. Then the
    receiver is back: a pass before the retry is due sends nothing (each resolved notice
    waits for its episode's notification), the pass at the retry sends both, in order."""
    plan = resolving(conn, notifier.name, outbox)
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(1, %s::int) g",
        (T0, KEYS),
    )
    assert claim_all(conn, plan, DUE) == KEYS
    assert deliver(db, notifier, DUE).retried == KEYS
    conn.execute("UPDATE orders SET status = 'shipped'")
    for t in (DUE + SWEPT, ENDED):
        claim_all(conn, plan, t)
    assert resolved(conn, outbox) == KEYS
    held = deliver(db, notifier, ENDED + S)
    assert (held.sent, held.total) == (0, 0)
    assert statuses(conn) == {"pending": 2 * KEYS}
    assert deliver(db, notifier, RETRIED).sent == 2 * KEYS
    assert statuses(conn) == {"sent": 2 * KEYS}


def firing_before_resolved(seen: list[tuple[str, str]]) -> None:
    """``seen``: (key, "firing" | "resolved") in the order the receiver took them."""
    for key in map(str, range(1, KEYS + 1)):
        mine = [state for k, state in seen if k == key]
        assert mine[0] == "firing" and mine[-1] == "resolved", (key, mine)
        assert "firing" not in mine[mine.index("resolved") :], (key, mine)


def test_webhook_gets_each_resolved_notice_after_its_notification(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    with WebhookReceiver() as receiver:
        receiver.replies = [Reply(500)]
        config = {"name": "hook", "type": "webhook", "url": receiver.url, "retry": RETRY}
        hook = WebhookNotifier(WebhookConfig.model_validate(config))
        ended_while_retrying(conn, db, hook, outbox)
        hook.close()
        seen = [(a["key"], a["status"]) for r in receiver.requests[1:] for a in r.alerts]
    assert len(seen) == 2 * KEYS
    firing_before_resolved(seen)


def test_pagerduty_opens_no_incident_that_nothing_closes(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    with PagerDutyService() as pd:
        pd.replies = [Reply(500, body=b"down")]
        config = {
            "name": "pd",
            "type": "pagerduty",
            "routing_key": ROUTING_KEY,
            "base_url": pd.base,
            "retry": RETRY,
        }
        pager = PagerDutyNotifier(PagerDutyConfig.model_validate(config))
        ended_while_retrying(conn, db, pager, outbox)
        pager.close()
    # One incident per episode, each closed by its resolve: no ghost left open.
    assert len(pd.incidents) == KEYS
    assert [i.status for i in pd.incidents] == ["resolved"] * KEYS
    actions = {"trigger": "firing", "resolve": "resolved"}
    seen = [(e["dedup_key"].split(":")[1], actions[e["event_action"]]) for e in pd.events]
    firing_before_resolved(seen)


def test_alertmanager_keeps_no_alert_firing_for_an_ended_episode(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    with AlertmanagerService() as am:
        am.replies = [Reply(500)]
        config = {"name": "am", "type": "alertmanager", "url": am.url, "retry": RETRY}
        manager = AlertmanagerNotifier(AlertmanagerConfig.model_validate(config))
        ended_while_retrying(conn, db, manager, outbox)
        manager.close()
        assert len(am.alerts) == KEYS
        # A firing alert after its endsAt would be active for firing_for (24 h).
        with freeze_time(RETRIED + M):
            assert am.active() == []
    seen = [
        (
            a["labels"]["key"],
            "resolved" if a["annotations"]["id"].endswith(":resolved") else "firing",
        )
        for r in am.requests[1:]
        for a in json.loads(r.body)
    ]
    assert len(seen) == 2 * KEYS
    firing_before_resolved(seen)


def test_slack_posts_each_resolved_notice_after_its_notification(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    with SlackService() as slack:
        slack.replies = [Reply(500, body=b"internal_error")]
        config = {"name": "slack", "type": "slack", "url": slack.url, "retry": RETRY}
        hook = SlackNotifier(SlackConfig.model_validate(config | {"listed": KEYS}))
        ended_while_retrying(conn, db, hook, outbox)
        hook.close()
    lines = [line for m in slack.messages for line in m["text"].splitlines()]
    pattern = re.compile(r"\[(resolved|warning)\] order_unshipped key (\d+)")
    seen = [
        (m[2], "resolved" if m[1] == "resolved" else "firing")
        for m in map(pattern.fullmatch, lines)
        if m
    ]
    assert len(seen) == 2 * KEYS
    firing_before_resolved(seen)


class Picky(Inbox):
    """Refuses firing notifications for good (HTTP 410) until ``fixed``; keeps what it
    takes, as (key, status)."""

    fixed = False

    def send(self, alerts: list[dict[str, Any]]) -> None:
        if not self.fixed and any(a["status"] == "firing" for a in alerts):
            raise DeliveryError("HTTP 410 Gone", permanent=True)
        super().send(alerts)


@pytest.mark.parametrize(
    "outbox",
    [
        "alerts",
        "rows",
    ],
)
def test_a_replayed_notification_is_followed_by_its_resolved_notice_again(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    """The notification went dead, the episode ended, its resolved notice went out. A
    replay of the notification alone would page after the all-clear: the resolved notice
    is sent again after it."""
    plan = resolving(conn, "console", outbox)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, DUE) == 1
    inbox = Picky()
    assert deliver(db, inbox, DUE).dead == 1
    conn.execute("UPDATE orders SET status = 'shipped'")
    for t in (DUE + SWEPT, ENDED):
        claim_all(conn, plan, t)
    assert deliver(db, inbox, ENDED).sent == 1  # nothing pending holds it back: sent
    inbox.fixed = True
    assert replay(conn, ENDED + M, None, None) == 1
    replayed = deliver(db, inbox, ENDED + 2 * M)
    assert [(a["key"], a["status"]) for a in inbox.got] == [
        ("1", "resolved"),
        ("1", "firing"),
        ("1", "resolved"),
    ]
    assert replayed.sent == 2
    assert statuses(conn) == {"sent": 2}
