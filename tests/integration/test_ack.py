"""Acknowledgements: an acked episode stays quiet; a new episode of the row pages again."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from slawatch.config.notifiers import RetrySettings
from slawatch.config.settings import Outbox
from slawatch.db import Database
from slawatch.delivery.dispatcher import PassResult, deliver_due
from slawatch.engine.claim import ClaimPlan
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.errors import BadInput, DeliveryError, NotFound
from slawatch.operate.inspect import list_alerts
from slawatch.operate.lifecycle import ack
from tests.integration.helpers import Conn, FixedClock, claim_all, episodes, plans, shop
from tests.integration.lifecycle_helpers import Inbox
from tests.integration.test_pagerduty import statuses

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DUE = T0 + 48 * H + S  # order_unshipped (every 6 h, 5 at most): paid at T0, overdue here


def two_orders(conn: Conn, track: str) -> ClaimPlan:
    plan = plans(conn, shop(conn, track))["order_unshipped"]
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 100, 'paid', %(t)s), (2, 7, 200, 'paid', %(t)s)",
        {"t": T0},
    )
    assert claim_all(conn, plan, DUE) == 2
    return plan


def next_time(conn: Conn, track: str, order: int) -> object:
    """When order ``order``'s next re-notification is due (None: none is)."""
    if track == "inline":
        query = "SELECT sw_order_unshipped_next FROM orders WHERE id = %s"
    else:
        query = "SELECT sw_next FROM slawatch.order_unshipped_state WHERE id = %s"
    row = conn.execute(query, (order,)).fetchone()
    assert row is not None
    return row[0]


def test_an_acked_episode_stays_quiet_and_a_new_episode_pages_again(
    conn: Conn, db: Database, track: str
) -> None:
    plan = two_orders(conn, track)
    got = ack(db, "order_unshipped:1:e1:n1", by="alice", comment="on it", now=DUE + M)
    assert (got.state, got.acked_by, got.comment, got.episode) == (
        "acknowledged",
        "alice",
        "on it",
        1,
    )
    # Order 2 (not acked) gets #2..#5 on time; order 1 nothing more in its episode.
    t = DUE
    for _ in range(6):
        t += 6 * H + S
        claim_all(conn, plan, t)
    assert episodes(conn, "order_unshipped") == [("1", 1, 1)] + [("2", 1, n) for n in range(1, 6)]
    # The acked row left the re-notify index (no next time), so it is not read again.
    assert next_time(conn, track, 1) is None
    # Order 1 ships, then is paid again: a new episode, which pages from #1 and renotifies.
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    t += 11 * M
    claim_all(conn, plan, t)
    conn.execute("UPDATE orders SET status = 'paid' WHERE id = 1")
    t += 11 * M
    assert claim_all(conn, plan, t) == 1
    t += 6 * H + S
    assert claim_all(conn, plan, t) == 1
    assert [e for e in episodes(conn, "order_unshipped") if e[0] == "1"] == [
        ("1", 1, 1),
        ("1", 2, 1),
        ("1", 2, 2),
    ]


def test_ack_by_numeric_id_keeps_the_first_ack(conn: Conn, db: Database, track: str) -> None:
    plan = two_orders(conn, track)
    # The id the API and `slawatch alerts` show (an element of a row has a negative one).
    with db.connection("listing") as c:
        listed = list_alerts(c, rule=None, status=None, since=None, cursor=None, limit=10)
    (alert_id,) = [a.id for a in listed.alerts if a.key == "2"]
    first = ack(db, str(alert_id), by="bob", comment="", now=DUE + M)
    assert (first.state, first.alert, first.alert_id) == (
        "acknowledged",
        "order_unshipped:2:e1:n1",
        alert_id,
    )
    again = ack(db, "order_unshipped:2:e1:n1", by="carol", comment="me too", now=DUE + 2 * M)
    assert (again.state, again.acked_by, again.acked_at) == ("already acknowledged", "bob", DUE + M)
    assert "already acknowledged by bob" in again.message()
    assert conn.execute("SELECT count(*) FROM slawatch.ack").fetchone() == (1,)
    claim_all(conn, plan, DUE + 6 * H + 2 * S)
    assert episodes(conn, "order_unshipped") == [("1", 1, 1), ("1", 1, 2), ("2", 1, 1)]


def test_ack_of_an_ended_episode_is_a_plain_answer(conn: Conn, db: Database, track: str) -> None:
    plan = two_orders(conn, track)
    # Order 1's deadline moves to a time already due: episode 1 ends, episode 2 pages.
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 1", (T0 + 30 * S,))
    assert claim_all(conn, plan, DUE + M) == 1
    got = ack(db, "order_unshipped:1:e1:n1", by="alice", comment="", now=DUE + 2 * M)
    assert (got.state, got.current) == ("ended", "order_unshipped:1:e2:n1")
    assert got.message() == (
        "episode 1 of order_unshipped:1 has ended: nothing to acknowledge;"
        " the row is overdue again: ack order_unshipped:1:e2:n1"
    )
    assert conn.execute("SELECT count(*) FROM slawatch.ack").fetchone() == (0,)


def test_a_key_with_colons_reads_back(conn: Conn, db: Database) -> None:
    """The key may hold ':' and even look like the tail: the tail is read from the end."""
    shop(conn)
    conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " VALUES ('job_hung', 'a:e1:n2', 3, 4, 'info', %s, '{}')",
        (T0,),
    )
    got = ack(db, "job_hung:a:e1:n2:e3:n4", by="alice", comment="", now=T0)
    assert (got.rule, got.key, got.episode, got.state) == ("job_hung", "a:e1:n2", 3, "acknowledged")


@pytest.mark.parametrize(
    ("alert", "error", "text"),
    [
        ("999", NotFound, "no alert 999"),
        ("order_unshipped:1:e9:n1", NotFound, "no alert order_unshipped:1:e9:n1"),
        ("order_unshipped:1:e1:resolved", NotFound, "no alert"),
        ("99999999999999999999999", NotFound, "no alert with id"),
        ("order_unshipped:1:e99999999999:n1", NotFound, "no alert"),
        ("0", NotFound, "no alert with id 0"),
        ("nope", BadInput, "is neither an alert id"),
        ("-1", NotFound, "no alert -1"),  # an element of the outbox's rows: none here
        ("--1", BadInput, "is neither an alert id"),
        ("Order:1:e1:n1", BadInput, "is neither an alert id"),
        ("order_unshipped:1:e1:n", BadInput, "is neither an alert id"),
        ("order_unshipped:1:e\u0661:n1", BadInput, "is neither an alert id"),
        ("", BadInput, "must not be empty"),
        ("order_unshipped:\x00:e1:n1", BadInput, "NUL"),
        ("9" * 10_000, BadInput, "longer than 2,000 characters"),
    ],
)
def test_unknown_or_malformed_alerts(
    conn: Conn, db: Database, alert: str, error: type[Exception], text: str
) -> None:
    two_orders(conn, "inline")
    with pytest.raises(error, match=text):
        ack(db, alert, by="alice", comment="", now=DUE)
    assert conn.execute("SELECT count(*) FROM slawatch.ack").fetchone() == (0,)


@pytest.mark.parametrize(
    ("by", "comment", "text"),
    [
        ("", "", "by: must not be empty"),
        ("a", "x" * 10_000, "comment: .* longer"),
        ("a\x00", "", "NUL"),
    ],
)
def test_bad_author_or_comment(conn: Conn, db: Database, by: str, comment: str, text: str) -> None:
    two_orders(conn, "inline")
    with pytest.raises(BadInput, match=text):
        ack(db, "order_unshipped:1:e1:n1", by=by, comment=comment, now=DUE)


def test_ack_never_waits_for_the_applications_lock_on_the_row(
    conn: Conn, db: Database, dsn: str
) -> None:
    """An ack writes only slawatch's own table: an application transaction holding the
    order's row does not hold it up (an HTTP request must not hang on the shop)."""
    two_orders(conn, "inline")
    with psycopg.connect(dsn) as app:
        app.execute("SELECT * FROM orders WHERE id = 1 FOR UPDATE")
        started = time.monotonic()
        got = ack(db, "order_unshipped:1:e1:n1", by="alice", comment="", now=DUE + M)
        assert time.monotonic() - started < 5
    assert got.state == "acknowledged"


def test_ack_of_a_resolved_episode_is_a_plain_answer(conn: Conn, db: Database, track: str) -> None:
    """resolve: true: the row completed and its notice went out; nothing to acknowledge."""
    from slawatch.engine.migrate import migrate
    from slawatch.engine.ready import prepare

    rule = shop(conn, track)["order_unshipped"].model_copy(update={"resolve": True})
    migrate(conn, [rule])
    plan = prepare(conn, rule)
    conn.execute("INSERT INTO orders VALUES (1, 7, 100, 'paid', %s)", (T0,))
    assert claim_all(conn, plan, DUE) == 1
    conn.execute("UPDATE orders SET status = 'shipped'")
    claim_all(conn, plan, DUE + 11 * M)
    for name in ("order_unshipped:1:e1:n1", "order_unshipped:1:e1:resolved"):
        got = ack(db, name, by="alice", comment="", now=DUE + 12 * M)
        assert (got.state, got.current) == ("ended", None)
        assert got.message() == "episode 1 of order_unshipped:1 has ended: nothing to acknowledge"
    assert conn.execute("SELECT count(*) FROM slawatch.ack").fetchone() == (0,)


# ---------------------------------------------------------------- what an ack does to a backlog


class Receiver(Inbox):
    """Refuses the first ``failures`` sends (a receiver down), then keeps what it gets;
    ``during`` runs inside a send, while its deliveries are in flight."""

    def __init__(self, failures: int, during: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.retry = RetrySettings(first=H, max=2 * H, attempts=5)
        self.failures, self.during = failures, during

    def send(self, alerts: list[dict[str, Any]]) -> None:
        if self.during is not None:
            self.during()
            self.during = None
        if self.failures > 0:
            self.failures -= 1
            raise DeliveryError("HTTP 503 Service Unavailable")
        super().send(alerts)


def resolving_orders(conn: Conn, outbox: Outbox) -> ClaimPlan:
    """Orders 1 and 2 overdue and claimed at DUE into ``outbox`` (resolved notices on)."""
    rule = shop(conn)["order_unshipped"].model_copy(update={"resolve": True})
    migrate(conn, [rule])
    plan = prepare(conn, rule, outbox=outbox)
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 100, 'paid', %(t)s), (2, 7, 200, 'paid', %(t)s)",
        {"t": T0},
    )
    assert claim_all(conn, plan, DUE) == 2
    return plan


def deliver(db: Database, receiver: Inbox, at: datetime) -> PassResult:
    return deliver_due(db, {"console": receiver}, FixedClock(at))


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_an_ack_settles_the_deliveries_waiting_to_retry_and_not_the_resolved_notice(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    plan = resolving_orders(conn, outbox)
    receiver = Receiver(failures=1)
    assert deliver(db, receiver, DUE).retried == 2  # the receiver is down
    ack(db, "order_unshipped:1:e1:n1", by="alice", comment="", now=DUE + M)
    # Today's outbox: settled by the ack itself, visible at once, and no longer a
    # backlog. A row's send settles it when it is leased again
    # (docs/explanation/outbox-rows.md, "Delivery").
    settled = {"acknowledged": 1, "pending": 1} if outbox == "alerts" else {"pending": 2}
    assert statuses(conn) == settled
    # The receiver is back: order 2's notification goes out, order 1's does not.
    assert deliver(db, receiver, DUE + 2 * H).sent == 1
    assert receiver.ids() == ["order_unshipped:2:e1:n1"]
    # Order 1 ships: its episode's resolved notice still goes out.
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    for t in (DUE + 2 * H + 11 * M, DUE + 2 * H + 22 * M):
        claim_all(conn, plan, t)
    assert deliver(db, receiver, DUE + 2 * H + 23 * M).sent == 1
    assert receiver.ids() == ["order_unshipped:1:e1:resolved", "order_unshipped:2:e1:n1"]
    with db.connection("listing") as c:
        page = list_alerts(c, rule=None, status="acknowledged", since=None, cursor=None, limit=10)
    assert [(a.idempotency_id, [d.status for d in a.deliveries]) for a in page.alerts] == [
        ("order_unshipped:1:e1:n1", ["acknowledged"])
    ]


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_a_delivery_in_flight_when_acked_is_settled_when_it_comes_back(
    conn: Conn, db: Database, outbox: Outbox
) -> None:
    """The ack leaves a delivery in flight to its sender; it failed, so the claim (or
    lease) that finds it due again settles it instead of sending it."""
    resolving_orders(conn, outbox)

    def acked() -> None:
        ack(db, "order_unshipped:1:e1:n1", by="alice", comment="", now=DUE + S)

    receiver = Receiver(failures=1, during=acked)
    assert deliver(db, receiver, DUE).retried == 2
    assert statuses(conn) == {"pending": 2}  # both were in flight at the ack
    result = deliver(db, receiver, DUE + 2 * H)
    assert (result.sent, result.acknowledged) == (1, 1)
    assert receiver.ids() == ["order_unshipped:2:e1:n1"]
    assert statuses(conn) == {"acknowledged": 1, "sent": 1}
