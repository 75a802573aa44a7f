"""Silences: deliveries of matching alerts are settled 'silenced' (recorded, never sent)
while the silence is active by the application's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from slawatch.actions.run import runner
from slawatch.config.rules import Rule
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_due, deliver_notifier
from slawatch.engine.claim import ClaimPlan
from slawatch.engine.migrate import migrate, schema_current
from slawatch.engine.ready import prepare
from slawatch.errors import BadInput, DeliveryError, NotFound
from slawatch.operate.inspect import list_alerts
from slawatch.operate.lifecycle import add_silence, delete_silence, list_silences
from tests.integration.helpers import Conn, FixedClock, alerts, claim_all, shop, unversioned
from tests.integration.lifecycle_helpers import Inbox
from tests.integration.test_deliver import shown_statuses

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DUE = T0 + 48 * H + S  # order_unshipped (every 6 h): paid at T0, overdue from here
# A silence keeps alerts from the receiver whichever shape of the outbox holds them: the
# tests that deliver run with each (docs/explanation/outbox-rows.md).
SHAPES = pytest.mark.parametrize("outbox", ["alerts", "rows"])


def orders(
    conn: Conn, users: list[int], outbox: Outbox = "rows"
) -> tuple[ClaimPlan, dict[str, Rule]]:
    """Orders 1, 2, ... of ``users``, all overdue at DUE; order_unshipped's claim into
    ``outbox``."""
    rules = shop(conn)
    for i, user in enumerate(users, start=1):
        conn.execute("INSERT INTO orders VALUES (%s, %s, 100, 'paid', %s)", (i, user, T0))
    plan = prepare(conn, rules["order_unshipped"], outbox=outbox).with_act(runner("off"))
    return plan, rules


def silence(db: Database, rules: dict[str, Rule], now: datetime, **kw: Any) -> int:
    args: dict[str, Any] = {
        "rule": "order_unshipped",
        "key": None,
        "matchers": None,
        "until": now + H,
        "comment": "deploy",
        "author": "alice",
    }
    return add_silence(db, **(args | kw), now=now, rules=rules).id


@SHAPES
def test_silenced_alerts_are_recorded_and_sent_again_once_the_silence_expires(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    plan, rules = orders(conn, [7, 7], outbox)
    sid = silence(db, rules, DUE - M, until=DUE + H)
    inbox = Inbox()
    assert claim_all(conn, plan, DUE) == 2
    result = deliver_due(db, {"console": inbox}, FixedClock(DUE))
    assert (result.sent, result.silenced) == (0, 2)
    assert inbox.got == []
    assert shown_statuses(conn) == {"silenced": 2}  # the alerts and their deliveries are kept
    assert len(alerts(conn, "order_unshipped")) == 2
    # Active until its end, by the application's clock; not at the end.
    assert [s.id for s in list_silences(db, now=DUE + H - S)] == [sid]
    assert list_silences(db, now=DUE + H) == []
    assert [s.active for s in list_silences(db, now=DUE + H, include_expired=True)] == [False]
    # #2 comes due after the silence ended: sent.
    assert claim_all(conn, plan, DUE + 6 * H + S) == 2
    deliver_due(db, {"console": inbox}, FixedClock(DUE + 6 * H + S))
    assert inbox.ids() == ["order_unshipped:1:e1:n2", "order_unshipped:2:e1:n2"]


@SHAPES
def test_a_delivery_due_after_the_silence_ended_is_sent(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    """Claimed while silenced, delivered (first tried) after the end: sent."""
    plan, rules = orders(conn, [7], outbox)
    silence(db, rules, DUE - M, until=DUE + M)
    assert claim_all(conn, plan, DUE) == 1
    inbox = Inbox()
    deliver_due(db, {"console": inbox}, FixedClock(DUE + M))
    assert inbox.ids() == ["order_unshipped:1:e1:n1"]


@SHAPES
def test_matchers_and_a_key_silence_only_their_alerts(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    plan, rules = orders(conn, [7, 7, 8, 9], outbox)
    silence(db, rules, DUE, matchers={"user_id": 8})  # order 3
    silence(db, rules, DUE, key="1")  # order 1
    silence(db, rules, DUE, matchers={"user_id": 9, "total_cents": 999})  # nothing: both must hold
    silence(db, rules, DUE, rule="refund_unprocessed")  # another rule
    assert claim_all(conn, plan, DUE) == 4
    inbox = Inbox()
    result = deliver_due(db, {"console": inbox}, FixedClock(DUE))
    assert inbox.ids() == ["order_unshipped:2:e1:n1", "order_unshipped:4:e1:n1"]
    assert (result.sent, result.silenced) == (2, 2)
    silenced = list_alerts(conn, status="silenced").alerts
    assert sorted(a.key for a in silenced) == ["1", "3"]


@SHAPES
def test_deleting_a_silence_ends_it(conn: Conn, db: Database, outbox: Outbox) -> None:
    plan, rules = orders(conn, [7], outbox)
    sid = silence(db, rules, DUE - H, until=DUE + H)
    ended = delete_silence(db, sid, now=DUE - M)
    assert (ended.ends_at, ended.active) == (DUE - M, False)
    assert delete_silence(db, sid, now=DUE).ends_at == DUE - M  # over already: kept
    assert list_silences(db, now=DUE) == []
    assert claim_all(conn, plan, DUE) == 1
    inbox = Inbox()
    deliver_due(db, {"console": inbox}, FixedClock(DUE))
    assert inbox.ids() == ["order_unshipped:1:e1:n1"]
    with pytest.raises(NotFound, match="no silence with id 999"):
        delete_silence(db, 999, now=DUE)
    with pytest.raises(NotFound):
        delete_silence(db, 2**70, now=DUE)


@SHAPES
def test_a_worker_goes_on_past_a_batch_that_was_all_silenced(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    """Silenced deliveries count towards a full batch: the pass claims again, so the
    unsilenced ones behind them are sent in the same pass."""
    plan, rules = orders(conn, [8, 8, 8, 8, 8, 7], outbox)  # order 6 is claimed last
    silence(db, rules, DUE, matchers={"user_id": 8})
    assert claim_all(conn, plan, DUE) == 6
    inbox = Inbox(batch=2)
    result = deliver_notifier(db, inbox, FixedClock(DUE))
    assert (result.sent, result.silenced) == (1, 5)
    assert inbox.ids() == ["order_unshipped:6:e1:n1"]


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"rule": "nope"}, "rule: no rule named 'nope'"),
        ({"rule": "x" * 10_000}, "rule: .* longer than"),
        ({"until": DUE}, "until: 2026-03-03T12:00:01Z is not after now"),
        ({"until": DUE - H}, "is not after now"),
        ({"until": DUE + timedelta(days=400)}, "more than a year away"),
        ({"until": datetime(2026, 3, 4)}, "until: .* is not a time with a zone"),
        ({"key": ""}, "key: must not be empty"),
        ({"key": "1\x00"}, "key: must not contain a NUL"),
        ({"key": "k" * 10_000}, "key: .* longer than 2,000"),
        ({"matchers": {"user id": 1}}, "is not a field name"),
        ({"matchers": {"status": "paid"}}, "have no field 'status'"),
        ({"matchers": {"user_id": [1]}}, "is not a string, number"),
        ({"matchers": {"user_id": {"a": 1}}}, "is not a string, number"),
        ({"matchers": {"user_id": float("nan")}}, "is not a JSON number"),
        ({"matchers": {"user_id": 10**40}}, "out of range"),
        ({"matchers": {"user_id": "\x00"}}, "NUL"),
        ({"matchers": "user_id=1"}, "is not an object"),
        ({"matchers": {f"c{i}": 1 for i in range(40)}}, "more than 32 fields"),
        ({"author": ""}, "author: must not be empty"),
        ({"comment": "c" * 10_000}, "comment: .* longer than"),
    ],
)
def test_bad_silences_are_refused(
    conn: Conn, db: Database, change: dict[str, Any], text: str
) -> None:
    _, rules = orders(conn, [7])
    with pytest.raises(BadInput, match=text):
        silence(db, rules, DUE, **change)
    assert list_silences(db, now=DUE, include_expired=True) == []


OLD_OUTBOX = """
CREATE SCHEMA slawatch;
CREATE TABLE slawatch.alert (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, rule text NOT NULL,
    key text NOT NULL, episode integer NOT NULL, n integer NOT NULL, severity text NOT NULL,
    deadline timestamptz, due_at timestamptz, fired_at timestamptz NOT NULL,
    row_data jsonb NOT NULL, CONSTRAINT alert_once UNIQUE (rule, key, episode, n));
CREATE TABLE slawatch.delivery (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, alert_id bigint NOT NULL,
    notifier text NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL,
    lease_owner uuid, lease_expires_at timestamptz, last_error text, sent_at timestamptz,
    CONSTRAINT delivery_once UNIQUE (alert_id, notifier));
CREATE TABLE slawatch.watermark (rule text PRIMARY KEY, scanned_to timestamptz NOT NULL,
    swept_at timestamptz);
INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)
VALUES ('order_unshipped', '1', 1, 1, 'warning', now(), '{}');
INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)
VALUES (1, 'console', 'sent', now());
"""


def test_an_outbox_from_before_silences_is_upgraded(conn: Conn) -> None:
    rules = shop(conn)
    conn.execute("DROP SCHEMA slawatch CASCADE")
    conn.execute(OLD_OUTBOX)
    assert not schema_current(conn)
    migrate(conn, list(rules.values()))
    assert schema_current(conn)
    assert conn.execute("SELECT kind FROM slawatch.alert").fetchall() == [("firing",)]
    conn.execute("UPDATE slawatch.delivery SET status = 'silenced'")  # now allowed
    migrate(conn, list(rules.values()))  # and again: idempotent
    checks = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'slawatch.delivery'::regclass"
        " AND contype = 'c'"
    ).fetchall()
    assert checks == [("delivery_status",)]
    # Each piece of the upgrade is looked for: a missing one asks for a migrate.
    for undo in (
        "ALTER TABLE slawatch.alert DROP COLUMN kind",
        "ALTER TABLE slawatch.delivery DROP CONSTRAINT delivery_status",
        "DROP TABLE slawatch.ack",
        "DROP TABLE slawatch.silence",
        "DROP TABLE slawatch.baseline",
    ):
        conn.execute(undo)
        unversioned(conn)  # an older release's shape, as that release left it
        assert not schema_current(conn), undo
        migrate(conn, list(rules.values()))
        assert schema_current(conn)


@SHAPES
def test_a_delivery_waiting_to_retry_under_a_new_silence_is_silenced(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    """The receiver was down when the alert fired; a silence comes before the retry: the
    retry finds it and settles the delivery instead of sending it."""
    plan, rules = orders(conn, [7, 8], outbox)
    assert claim_all(conn, plan, DUE) == 2

    class Down(Inbox):
        def send(self, alerts: list[dict[str, Any]]) -> None:
            raise DeliveryError("HTTP 503 Service Unavailable")

    assert deliver_due(db, {"console": Down()}, FixedClock(DUE)).retried == 2
    silence(db, rules, DUE + S, key="1")
    inbox = Inbox()
    result = deliver_due(db, {"console": inbox}, FixedClock(DUE + H))
    assert (result.sent, result.silenced) == (1, 1)
    assert inbox.ids() == ["order_unshipped:2:e1:n1"]
    assert shown_statuses(conn) == {"sent": 1, "silenced": 1}
