"""The delivery loop on today's outbox (slawatch.alert / slawatch.delivery): payloads,
retries, dead letters, fenced writes. The rows' delivery: test_outbox_rows_deliver.py."""

from __future__ import annotations

import io
import json
import logging
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from freezegun import freeze_time
from psycopg.rows import dict_row

from slawatch.clock import Clock
from slawatch.config.notifiers import ConsoleConfig, RetrySettings
from slawatch.config.settings import Outbox
from slawatch.db import Connection, Database
from slawatch.delivery.dispatcher import (
    claim_deliveries,
    deliver_batch,
    deliver_due,
    deliver_notifier,
    deliveries_due,
    replay,
)
from slawatch.delivery.notifiers.base import BaseNotifier, encode
from slawatch.delivery.notifiers.console import ConsoleNotifier
from slawatch.engine.claim import plan_claim
from slawatch.engine.outbox import alert_payload
from slawatch.engine.queries import queries
from slawatch.errors import DeliveryError
from slawatch.operate.inspect import MAX_LIMIT, Delivery, list_alerts
from tests.integration.helpers import (
    Conn,
    FixedClock,
    by_parent,
    claim_all,
    partitions,
    shop,
)
from tests.waiting import lock_waits, wait_until

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CLAIMED = T0 + timedelta(days=3)  # when the alerts were claimed and became deliverable
NOTHING_SENT: dict[str, Any] = {
    "sent": [],
    "sent_alerts": [],
    "sent_owner": None,
}  # a claim settling no batch


class FlakyReceiver(BaseNotifier):
    """A receiver that refuses the first ``failures`` sends, then keeps what it gets."""

    def __init__(self, failures: int, retry: RetrySettings | None = None, batch: int = 100) -> None:
        super().__init__(
            ConsoleConfig(
                name="console", type="console", retry=retry or RetrySettings(), batch=batch
            )
        )
        self.failures = failures
        self.got: list[dict[str, Any]] = []
        self.requests = 0

    def send(self, alerts: list[dict[str, Any]]) -> None:
        self.requests += 1
        if self.failures > 0:
            self.failures -= 1
            raise DeliveryError("ConnectionError: receiver down")
        self.got.extend(alerts)


# This module's subject is today's outbox, its deliveries one by one: pinned to "alerts".
OUTBOX: Outbox = "alerts"


def overdue_orders(
    conn: Conn, count: int, notify: str = "console", outbox: Outbox = OUTBOX
) -> None:
    """``count`` orders overdue, claimed at CLAIMED into ``outbox``: one pending delivery
    each to ``notify`` (in "rows": a send to ``notify`` per row of up to 100)."""
    rule = shop(conn)["order_unshipped"].model_copy(update={"notify": [notify]})
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 990, 'paid', %s FROM generate_series(1, %s::int) g",
        (T0, count),
    )
    plan = plan_claim(rule, "timestamp with time zone", outbox_in=outbox)
    assert claim_all(conn, plan, CLAIMED) == count


def statuses(conn: Conn) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM slawatch.delivery GROUP BY 1"))


def shown_deliveries(conn: Conn) -> list[Delivery]:
    """Every alert's deliveries as `slawatch alerts` and the API show them, whichever
    shape of the outbox holds the alerts (docs/explanation/outbox-rows.md): one per alert
    and notifier, with its status, attempts, next attempt and last error."""
    out: list[Delivery] = []
    cursor: int | None = None
    while True:
        page = list_alerts(conn, cursor=cursor, limit=MAX_LIMIT)
        out += [d for a in page.alerts for d in a.deliveries]
        if page.next_cursor is None:
            return out
        cursor = int(page.next_cursor)


def shown_statuses(conn: Conn) -> dict[str, int]:
    """:func:`statuses` as `slawatch alerts` shows them, in either shape of the outbox."""
    return dict(Counter(d.status for d in shown_deliveries(conn)))


def test_console_prints_the_payload_and_marks_sent(conn: Conn, db: Database) -> None:
    overdue_orders(conn, 3)
    out = io.StringIO()
    console = ConsoleNotifier(ConsoleConfig(name="console", type="console"), out)
    with freeze_time(CLAIMED):
        result = deliver_due(db, {"console": console}, Clock(), {"order_unshipped": "late"})
    assert (result.sent, result.retried, result.dead) == (3, 0, 0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[warning] order_unshipped #1 key=1 due 2026-03-03T12:00:00Z {")
    assert json.loads(lines[0].split(" ", 6)[6]) == {
        "id": 1,
        "paid_at": "2026-03-01T12:00:00+00:00",
        "user_id": 7,
        "total_cents": 990,
    }
    assert statuses(conn) == {"sent": 3}


# Alerts whose times and rows are where the claim's answer (times as text, row_data
# through RowDataLoader) could part from a plain read: microseconds none, with trailing
# zeros, one; a year below 1000; no deadline; numbers jsonb keeps as written (12.50),
# past 64 bits, at the edges of 64 bits, long fractions; escapes, nesting.
ODD_ALERTS = [
    (
        "2026-03-01 12:00:00+00",
        "2026-03-03 12:00:00+00",
        "2026-03-04 12:00:00+00",
        '{"total": 12.50, "n": 1, "f": 0.1, "tiny": 1e-7, "neg": -0.0}',
    ),
    (
        "2026-03-01 12:00:00.5+00",
        "2026-03-03 12:00:00.000001+00",
        "2026-03-04 12:00:00.12+00",
        '{"big": 123456789012345678901234567890, "u64": 18446744073709551615}',
    ),
    (
        "0999-01-01 00:00:00+00",
        None,
        "2026-03-04 12:00:00.999999+00",
        '{"i64": -9223372036854775808, "past": -9223372036854775809, "s": "é\\u0001\\"\\\\"}',
    ),
    (
        None,
        None,
        "2026-03-04 12:00:00+00",
        '{"long": 0.123456789012345678, "longer": 0.1234567890123456789012, "x": [1, {"a": null}]}',
    ),
    (
        "2026-03-01 12:00:00+00",
        "2026-03-03 12:00:00+00",
        "2026-03-04 12:00:00+00",
        "[" * 600 + "]" * 600,
    ),
]


def test_receivers_get_the_alert_byte_for_byte_as_a_plain_read_shapes_it(
    conn: Conn, db: Database
) -> None:
    """The claim hands the worker its alerts' times as text and decodes row_data its own
    way; every notifier gets the payload that alert_payload makes of a plain read of the
    alert (datetimes, psycopg's json.loads), and the webhook the same bytes."""
    shop(conn)
    for i, (deadline, due_at, fired_at, row) in enumerate(ODD_ALERTS, 1):
        conn.execute(
            "WITH a AS (INSERT INTO slawatch.alert"
            " (rule, key, episode, n, severity, deadline, due_at, fired_at, row_data)"
            " VALUES ('order_unshipped', %s, 1, 1, 'warning', %s, %s, %s, %s::jsonb)"
            " RETURNING id)"
            " INSERT INTO slawatch.delivery (alert_id, notifier, next_attempt_at)"
            " SELECT id, 'console', %s FROM a",
            (str(i), deadline, due_at, fired_at, row, CLAIMED),
        )
    receiver = FlakyReceiver(failures=0)
    with freeze_time(CLAIMED):
        result = deliver_due(db, {"console": receiver}, Clock(), {"order_unshipped": "late"})
    assert result.sent == len(ODD_ALERTS)

    def plain(c: Connection) -> list[dict[str, Any]]:
        cur = c.cursor(row_factory=dict_row)
        return cur.execute(
            "SELECT rule, key, episode, n, kind, severity, deadline, due_at, fired_at, row_data"
            " FROM slawatch.alert ORDER BY key"
        ).fetchall()

    expected = [alert_payload(r, "late") for r in db.run("reading alerts", plain)]
    got = sorted(receiver.got, key=lambda a: a["key"])
    assert [encode(a) for a in got] == [encode(a) for a in expected]
    assert encode({"alerts": got}) == encode({"alerts": expected})
    assert got[0]["deadline"] == "2026-03-01T12:00:00Z"
    assert got[1]["due_at"] == "2026-03-03T12:00:00.000001Z"
    assert isinstance(got[1]["row"]["big"], int) and got[0]["row"]["total"] == 12.5


def test_failures_retry_with_backoff_then_go_dead_with_the_error(conn: Conn, db: Database) -> None:
    overdue_orders(conn, 2)
    retry = RetrySettings(first=timedelta(seconds=10), max=timedelta(seconds=30), attempts=4)
    receiver = FlakyReceiver(failures=99, retry=retry)
    with freeze_time(CLAIMED) as clock:
        waits = []
        for _ in range(3):
            assert deliver_batch(db, receiver, Clock()).retried == 2
            (nxt,) = conn.execute(
                "SELECT DISTINCT next_attempt_at FROM slawatch.delivery"
            ).fetchone()
            waits.append((nxt - datetime.now(UTC)).total_seconds())
            assert deliver_batch(db, receiver, Clock()).total == 0  # not due yet
            clock.move_to(nxt)
        # min(first * 2^(attempt-1), max), less up to 20% jitter
        for wait, full in zip(waits, [10, 20, 30], strict=True):
            assert 0.8 * full <= wait <= full
        assert deliver_batch(db, receiver, Clock()).dead == 2  # the 4th attempt was the last
    assert statuses(conn) == {"dead": 2}
    errors = conn.execute("SELECT DISTINCT last_error FROM slawatch.delivery").fetchall()
    assert errors == [("ConnectionError: receiver down",)]


def test_permanent_failure_is_dead_at_once_and_replay_revives(conn: Conn, db: Database) -> None:
    overdue_orders(conn, 2)

    class Gone(FlakyReceiver):
        def send(self, alerts: list[dict[str, Any]]) -> None:
            raise DeliveryError("HTTP 410 Gone", permanent=True)

    with freeze_time(CLAIMED):
        assert deliver_batch(db, Gone(0), Clock()).dead == 2
    assert statuses(conn) == {"dead": 2}
    assert replay(conn, CLAIMED, "nope", None) == 0
    assert replay(conn, CLAIMED, "order_unshipped", "console") == 2
    receiver = FlakyReceiver(failures=0)
    with freeze_time(CLAIMED):
        assert deliver_batch(db, receiver, Clock()).sent == 2
    assert statuses(conn) == {"sent": 2}


def test_retry_after_is_honoured(conn: Conn, db: Database) -> None:
    overdue_orders(conn, 1)

    class Busy(FlakyReceiver):
        def send(self, alerts: list[dict[str, Any]]) -> None:
            raise DeliveryError("HTTP 429 Too Many Requests", retry_after=120)

    with freeze_time(CLAIMED):
        assert deliver_batch(db, Busy(0), Clock()).retried == 1
    (nxt,) = conn.execute("SELECT next_attempt_at FROM slawatch.delivery").fetchone()
    assert nxt == CLAIMED + timedelta(seconds=120)


def test_a_receiver_that_recovers_gets_every_alert(conn: Conn, db: Database) -> None:
    overdue_orders(conn, 250)
    receiver = FlakyReceiver(failures=3)
    with freeze_time(CLAIMED) as clock:
        for _ in range(10):
            deliver_due(db, {"console": receiver}, Clock())
            clock.tick(timedelta(minutes=10))
    assert sorted(a["id"] for a in receiver.got) == sorted(
        f"order_unshipped:{k}:e1:n1" for k in range(1, 251)
    )
    assert statuses(conn) == {"sent": 250}


def test_a_lost_lease_fences_the_old_owner_out(conn: Conn) -> None:
    overdue_orders(conn, 1)
    q = queries()
    old, new = uuid.uuid4(), uuid.uuid4()
    lease = timedelta(seconds=30)
    claim = {"limit": 10, "lease": lease, "notifier": "console"} | NOTHING_SENT
    (first,) = conn.execute(
        q["claim_deliveries"], claim | {"now": CLAIMED, "owner": old}
    ).fetchall()
    # Not due again while the lease holds...
    assert (
        conn.execute(q["claim_deliveries"], claim | {"now": CLAIMED, "owner": new}).fetchall() == []
    )
    # ...but once it expired (the old owner stalled), another process takes it over.
    later = CLAIMED + lease + timedelta(seconds=1)
    (second,) = conn.execute(q["claim_deliveries"], claim | {"now": later, "owner": new}).fetchall()
    assert first[0] == second[0] and second[2] == 2  # same delivery, attempt 2
    stale = conn.execute(
        q["mark_sent"], {"ids": [first[0]], "alerts": [first[4]], "owner": old, "now": later}
    )
    assert stale.rowcount == 0
    stale = conn.execute(
        q["mark_dead"], {"ids": [first[0]], "alerts": [first[4]], "owner": old, "error": "x"}
    )
    assert stale.rowcount == 0
    retry = {
        "ids": [first[0]],
        "alerts": [first[4]],
        "owner": old,
        "error": "x",
        "nexts": [CLAIMED],
    }
    assert conn.execute(q["mark_retry"], retry).rowcount == 0  # nor reschedule it
    assert statuses(conn) == {"pending": 1}
    # Nor settle it through the claim of its next batch.
    settle = claim | {
        "now": later,
        "owner": uuid.uuid4(),
        "sent": [first[0]],
        "sent_alerts": [first[4]],
        "sent_owner": old,
    }
    assert conn.execute(q["claim_deliveries"], settle).fetchall() == []
    assert statuses(conn) == {"pending": 1}
    done = conn.execute(
        q["mark_sent"], {"ids": [first[0]], "alerts": [first[4]], "owner": new, "now": later}
    )
    assert done.rowcount == 1


def test_a_lease_is_a_hot_update_that_leaves_the_due_time_alone(conn: Conn, dsn: str) -> None:
    """The claim leases by writing columns no index covers, on pages with room for the
    new version (0014_delivery_lease.sql): every lease is a HOT update, no new index
    entry. next_attempt_at stays the due time; the lease's expiry is lease_expires_at,
    and the status page shows that as the next attempt (deliveries_of)."""
    overdue_orders(conn, 2000)  # several pages: without the fillfactor's room, full ones
    q = queries()
    lease = timedelta(seconds=30)
    claim = {"limit": 500, "lease": lease, "notifier": "console", "now": CLAIMED}
    with psycopg.connect(dsn) as tx:  # the counters of this transaction
        rows = tx.execute(q["claim_deliveries"], claim | NOTHING_SENT | {"owner": uuid.uuid4()})
        assert len(rows.fetchall()) == 500
        counts = tx.execute(
            # summed over the outbox's partitions (its id ranges: 0015_rotate.sql)
            "SELECT sum(pg_stat_get_xact_tuples_updated(p.relid))::int,"
            " sum(pg_stat_get_xact_tuples_hot_updated(p.relid))::int"
            " FROM pg_partition_tree('slawatch.delivery') p WHERE p.isleaf"
        ).fetchone()
        assert counts == (500, 500)
    leased = conn.execute(
        "SELECT DISTINCT next_attempt_at, lease_expires_at FROM slawatch.delivery"
        " WHERE lease_owner IS NOT NULL"
    ).fetchall()
    assert leased == [(CLAIMED, CLAIMED + lease)]
    some = conn.execute(
        "SELECT alert_id FROM slawatch.delivery WHERE lease_owner IS NOT NULL LIMIT 1"
    ).fetchone()
    assert some is not None
    (shown,) = conn.execute(q["deliveries_of"], {"ids": [some[0]]}).fetchall()
    assert shown[5] == CLAIMED + lease  # in flight: tried next when its lease runs out


def test_the_next_claim_settles_the_batch_sent_and_never_takes_it_again(conn: Conn) -> None:
    """Even when its lease ran out while it was sent (a slow receiver), a batch settled
    by the claim of the next one is marked sent and not claimed again."""
    overdue_orders(conn, 3)
    q = queries()
    owner, lease = uuid.uuid4(), timedelta(seconds=30)
    claim = {"limit": 2, "lease": lease, "notifier": "console"}
    sent = conn.execute(
        q["claim_deliveries"], claim | NOTHING_SENT | {"now": CLAIMED, "owner": owner}
    ).fetchall()
    later = CLAIMED + lease + timedelta(seconds=1)  # the sent batch is due again by now
    ids = [r[0] for r in sent]
    alerts = [r[4] for r in sent]
    settle = {
        "now": later,
        "owner": uuid.uuid4(),
        "sent": ids,
        "sent_alerts": alerts,
        "sent_owner": owner,
    }
    rows = conn.execute(q["claim_deliveries"], claim | settle).fetchall()
    # The ids of the rows it settled come back as one row 'sent' (the worker marks the
    # rest itself).
    (settled,) = [r for r in rows if r[3] == "sent"]
    assert sorted(settled[16]) == sorted(ids)
    (claimed,) = [r for r in rows if r[3] != "sent"]
    assert claimed[0] not in ids
    rows = conn.execute("SELECT id, status, attempts FROM slawatch.delivery").fetchall()
    assert {i: (s, n) for i, s, n in rows} == {
        ids[0]: ("sent", 1),
        ids[1]: ("sent", 1),
        claimed[0]: ("pending", 1),
    }


def deliveries(conn: Conn) -> list[tuple[str, str, int, datetime]]:
    """(alert key, status, attempts, next attempt) of every delivery, by key."""
    rows = conn.execute(
        "SELECT a.key, d.status, d.attempts, d.next_attempt_at FROM slawatch.delivery d"
        " JOIN slawatch.alert a ON a.id = d.alert_id ORDER BY a.key::int"
    ).fetchall()
    return [(k, s, n, t) for k, s, n, t in rows]


def test_each_delivery_of_a_failed_batch_is_settled_by_its_own_attempts(
    conn: Conn, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Attempts (2, 0, 0) of 3: the first goes dead, the others retry after *their* backoff."""
    overdue_orders(conn, 3)
    conn.execute(
        "UPDATE slawatch.delivery d SET attempts = 2 FROM slawatch.alert a"
        " WHERE a.id = d.alert_id AND a.key = '1'"
    )
    retry = RetrySettings(first=timedelta(seconds=10), max=timedelta(hours=1), attempts=3)
    with freeze_time(CLAIMED):
        result = deliver_batch(db, FlakyReceiver(failures=1, retry=retry), Clock())
    assert (result.sent, result.retried, result.dead) == (0, 2, 1)
    rows = deliveries(conn)
    assert [(k, s, n) for k, s, n, _ in rows] == [
        ("1", "dead", 3),
        ("2", "pending", 1),
        ("3", "pending", 1),
    ]
    for _, _, _, nxt in rows[1:]:
        # Backoff after attempt 1: `first`, less up to 20% jitter (not attempt 3's 40s).
        assert 8 <= (nxt - CLAIMED).total_seconds() <= 10
    dead = [r for r in caplog.records if r.levelno == logging.ERROR and "dead" in r.getMessage()]
    assert [r.getMessage() for r in dead] == [
        "notifier console: 1 deliveries dead (attempt 3 was the last): "
        "ConnectionError: receiver down"
    ]


def test_a_receiver_outage_is_one_warning_and_one_line_when_it_ends(
    conn: Conn, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    overdue_orders(conn, 2)
    retry = RetrySettings(first=timedelta(seconds=1), max=timedelta(seconds=1), attempts=10)
    receiver = FlakyReceiver(failures=3, retry=retry)
    with freeze_time(CLAIMED) as clock:
        for _ in range(4):
            deliver_batch(db, receiver, Clock())
            clock.tick(timedelta(seconds=5))
    assert statuses(conn) == {"sent": 2}
    lines = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "slawatch.delivery.dispatcher" and r.levelno >= logging.INFO
    ]
    assert lines == [
        (logging.WARNING, "notifier console: receiver failing: ConnectionError: receiver down"),
        (logging.INFO, "notifier console: receiver accepting again after 15s"),
    ]


def test_a_failed_full_batch_ends_the_notifiers_pass(conn: Conn, db: Database) -> None:
    """The receiver is down: one request, not one per due batch."""
    overdue_orders(conn, 6)
    receiver = FlakyReceiver(failures=99, batch=2)
    with freeze_time(CLAIMED):
        result = deliver_notifier(db, receiver, Clock())
    assert receiver.requests == 1
    assert (result.sent, result.retried) == (0, 2)
    # A working receiver gets every full batch in one pass.
    working = FlakyReceiver(failures=0, batch=2)
    with freeze_time(CLAIMED + timedelta(hours=1)):
        assert deliver_notifier(db, working, Clock()).sent == 6
    assert working.requests == 3


def test_two_delivery_claimers_skip_each_others_rows(conn: Conn, dsn: str) -> None:
    """One claim holds its rows in an open transaction; the other gets the rest at once."""
    overdue_orders(conn, 10)
    q = queries()
    claim = {"now": CLAIMED, "lease": timedelta(seconds=30), "notifier": "console"} | NOTHING_SENT
    with psycopg.connect(dsn) as first:  # not autocommit: the claim stays open
        held = first.execute(
            q["claim_deliveries"], claim | {"owner": uuid.uuid4(), "limit": 4}
        ).fetchall()
        # Waiting for the first claim's row locks would be the bug: fail instead of waiting.
        conn.execute("SET lock_timeout = '3s'")
        rest = conn.execute(
            q["claim_deliveries"], claim | {"owner": uuid.uuid4(), "limit": 10}
        ).fetchall()
        first.rollback()
    assert len(held) == 4 and len(rest) == 6
    assert {r[0] for r in held}.isdisjoint(r[0] for r in rest)


def delivery_scans(plan: dict[str, Any]) -> list[str]:
    """The index (or "Seq Scan") of every scan of slawatch.delivery in an EXPLAIN's plan."""
    found = []
    if plan.get("Relation Name") == "delivery" and plan["Node Type"] != "ModifyTable":
        found.append(plan.get("Index Name", plan["Node Type"]))
    for child in plan.get("Plans", []):
        found += delivery_scans(child)
    return found


def test_a_claim_probes_each_alerts_delivery_by_its_key_even_with_stale_statistics(
    conn: Conn,
) -> None:
    """The per-episode order checks (a resolved notice waiting, a firing notification
    holding one back) look up one (alert, notifier) delivery through delivery_once.
    Planned on statistics that still have the table empty (a first burst, before
    autoanalyze), they used to walk every pending delivery of the notifier through
    delivery_due for each claimed row: 20 k pending made a claim of 100 take minutes."""
    shop(conn)
    conn.execute("ANALYZE slawatch.delivery, slawatch.alert")  # empty
    for table in ("delivery", "alert"):
        for part in partitions(conn, table):  # its id ranges (0015_rotate.sql)
            conn.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = false)")
    overdue_orders(conn, 3000)
    claim = {"now": CLAIMED, "owner": uuid.uuid4(), "lease": timedelta(seconds=30)}
    params = claim | NOTHING_SENT | {"limit": 100, "notifier": "console"}
    (plan,) = conn.execute(
        "EXPLAIN (FORMAT JSON) " + queries()["claim_deliveries"], params
    ).fetchone()  # type: ignore[misc]
    scans = delivery_scans(by_parent(conn, plan[0]["Plan"]))
    # The due deliveries in order of next attempt; every other look is by a key.
    assert scans.count("delivery_due") == 1, scans
    assert "Seq Scan" not in scans, scans


def test_a_claim_settling_a_batch_never_waits_for_a_row_another_claim_holds(
    conn: Conn, db: Database, dsn: str
) -> None:
    """A claim's `due` may keep a row of another worker's sent batch locked for a moment
    (it looked due in its snapshot). The claim settling that batch takes the rest at once
    and never waits inside its statement (two such waits deadlocked); the held row is
    marked sent once it is free, by a statement of its own."""
    overdue_orders(conn, 6)
    notifier = FlakyReceiver(failures=0, batch=3)
    batch = claim_deliveries(db, notifier, CLAIMED)
    ids = [r["id"] for r in batch.rows]
    held, rest = ids[0], ids[1:]
    with psycopg.connect(dsn) as other:  # not autocommit: the lock stays until rollback
        other.execute("SELECT 1 FROM slawatch.delivery WHERE id = %s FOR UPDATE", (held,))
        done: list[Any] = []
        worker = threading.Thread(
            target=lambda: done.append(claim_deliveries(db, notifier, CLAIMED, sent=batch))
        )
        worker.start()
        try:
            # The claim committed (the rest settled, the next batch leased) while the
            # row is still held: only then does anything wait for it.
            wait_until(
                lambda: statuses(conn) == {"sent": 2, "pending": 4},
                "the claim to settle the rows it could lock",
            )
            wait_until(lambda: lock_waits(conn) == ["transactionid"], "mark_sent to wait")
            (left,) = conn.execute(
                "SELECT status FROM slawatch.delivery WHERE id = %s", (held,)
            ).fetchone()  # type: ignore[misc]
            assert left == "pending"
        finally:
            other.rollback()
            worker.join(10)
    assert not worker.is_alive()
    sent = conn.execute("SELECT id FROM slawatch.delivery WHERE status = 'sent'").fetchall()
    assert sorted(r[0] for r in sent) == sorted([held, *rest])
    assert len(done[0].rows) == 3 and {r["id"] for r in done[0].rows}.isdisjoint(ids)


def test_the_claim_and_mark_sent_commit_asynchronously_and_mark_dead_does_not(
    conn: Conn, dsn: str
) -> None:
    """A lost lease or 'sent' only means a resend: those commits do not wait for the WAL
    flush (a claim that leases, one that only settles a batch, mark_sent). A dead letter
    does."""
    overdue_orders(conn, 3)
    q = queries()
    owner = uuid.uuid4()
    claim = {"limit": 3, "lease": timedelta(seconds=30), "notifier": "console", "now": CLAIMED}

    def synchronous(tx: psycopg.Connection[Any]) -> str:
        (value,) = tx.execute("SHOW synchronous_commit").fetchone()  # type: ignore[misc]
        tx.commit()
        return str(value)

    with psycopg.connect(dsn) as tx:  # not autocommit: the setting is the transaction's
        first, second, third = tx.execute(
            q["claim_deliveries"], claim | NOTHING_SENT | {"owner": owner}
        ).fetchall()
        assert synchronous(tx) == "off"
        assert synchronous(tx) == "on"  # for that transaction only
        settle = claim | {
            "owner": uuid.uuid4(),
            "sent": [first[0]],
            "sent_alerts": [first[4]],
            "sent_owner": owner,
        }
        assert [r[3] for r in tx.execute(q["claim_deliveries"], settle).fetchall()] == ["sent"]
        assert synchronous(tx) == "off"  # nothing more was due: settling alone
        tx.execute(
            q["mark_sent"],
            {"ids": [second[0]], "alerts": [second[4]], "owner": owner, "now": CLAIMED},
        )
        assert synchronous(tx) == "off"
        tx.execute(
            q["mark_dead"], {"ids": [third[0]], "alerts": [third[4]], "owner": owner, "error": "x"}
        )
        assert synchronous(tx) == "on"
    assert statuses(conn) == {"sent": 2, "dead": 1}


def test_each_due_deliverys_alert_is_probed_by_its_key_whatever_the_costs(conn: Conn) -> None:
    """The claim reads due deliveries in order from delivery_due and each one's alert by
    its primary key. As a join, a planner that priced index probes high (statistics
    gathered mid-drain did) hashed every alert and sorted every pending delivery for
    each claim of 100 (100 ms instead of 2)."""
    overdue_orders(conn, 3000)
    conn.execute("ANALYZE slawatch.delivery, slawatch.alert")
    conn.execute("SET random_page_cost = 40")
    params = {"now": CLAIMED, "owner": uuid.uuid4(), "lease": timedelta(seconds=30)}
    params |= NOTHING_SENT | {"limit": 100, "notifier": "console"}
    (plan,) = conn.execute(
        "EXPLAIN (FORMAT JSON) " + queries()["claim_deliveries"], params
    ).fetchone()  # type: ignore[misc]
    scans: list[tuple[str, str]] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") in ("delivery", "alert") and node["Node Type"] != (
            "ModifyTable"
        ):
            scans.append((node["Relation Name"], node.get("Index Name", node["Node Type"])))
        for child in node.get("Plans", []):
            walk(child)

    walk(by_parent(conn, plan[0]["Plan"]))
    assert ("delivery", "delivery_due") in scans, scans
    assert ("alert", "alert_pkey") in scans, scans
    assert ("alert", "Seq Scan") not in scans, scans


def test_a_claim_leases_its_deliveries_by_their_alert_ids_reading_no_others(conn: Conn) -> None:
    """delivery.id has no index (0018_lean_outbox.sql): the claim's lease finds its rows
    through delivery_once by their alert ids, then their ids. By id alone (and the
    batch's lowest alert id) it read every delivery of every alert from there up: 3,000
    pending, 100 leased, 3,000 rows read."""
    overdue_orders(conn, 3000)
    conn.execute("ANALYZE slawatch.delivery, slawatch.alert")
    params = {"now": CLAIMED, "owner": uuid.uuid4(), "lease": timedelta(seconds=30)}
    params |= NOTHING_SENT | {"limit": 100, "notifier": "console"}
    with conn.transaction(force_rollback=True):
        (plan,) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + queries()["claim_deliveries"], params
        ).fetchone()  # type: ignore[misc]
    read: list[tuple[str, float]] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "delivery" and node["Node Type"] != "ModifyTable":
            rows = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            read.append((node.get("Index Name", node["Node Type"]), rows * node["Actual Loops"]))
        for child in node.get("Plans", []):
            walk(child)

    walk(by_parent(conn, plan[0]["Plan"]))
    assert statuses(conn) == {"pending": 3000}
    assert ("delivery_once", 100) in read, read
    assert all(rows <= 100 for index, rows in read if index != "delivery_due"), read


def test_a_worker_that_wakes_claims_only_when_the_probe_says_something_is_due(
    conn: Conn, db: Database
) -> None:
    """A worker asks slawatch.deliveries_due before its first claim after it wakes, and
    claims only on yes: the probe must say yes whenever the claim would take something
    (a due delivery, one whose lease ran out) and no when it would take nothing (none due
    yet, all in flight, another notifier's, all sent)."""
    overdue_orders(conn, 3)
    receiver, other = FlakyReceiver(0), FlakyReceiver(0)
    other.name = "elsewhere"

    def due(at: datetime, notifier: BaseNotifier = receiver) -> bool:
        return deliveries_due(db, notifier, at)

    assert (due(CLAIMED - timedelta(seconds=1)), due(CLAIMED), due(CLAIMED, other)) == (
        False,
        True,
        False,
    )
    flying = claim_deliveries(db, receiver, CLAIMED)
    assert flying.claimed == 3
    assert not due(CLAIMED)  # all three in flight
    lease_over = CLAIMED + timedelta(hours=1)
    assert due(lease_over)
    assert deliver_notifier(db, receiver, FixedClock(lease_over)).sent == 3
    assert not due(lease_over + timedelta(days=1))
    assert deliver_notifier(db, receiver, FixedClock(lease_over)).sent == 0


def test_the_wake_up_probes_plan_is_the_due_index_whatever_the_plan_cache_does(
    conn: Conn,
) -> None:
    """deliveries_due keeps one plan per server process (PL/pgSQL, force_generic_plan):
    that generic plan must read the notifier's due index, never scan the outbox, which
    holds every sent delivery of the retention window."""
    overdue_orders(conn, 2000)
    conn.execute("UPDATE slawatch.delivery SET status = 'sent' WHERE alert_id % 100 <> 0")
    conn.execute("ANALYZE slawatch.delivery")
    (source,) = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = 'deliveries_due_by_shape'"
    ).fetchone()  # type: ignore[misc]
    # The first probe: deliveries (the second, of row sends: test_outbox_rows_deliver.py).
    inner = source[source.index("(SELECT") + 1 : source.index(") <= at")]
    body = inner.replace("notifier_name", "$1").replace("<= at", "<= $2")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE due_probe(text, timestamptz) AS {body}")
    (plan,) = conn.execute(
        f"EXPLAIN (FORMAT JSON) EXECUTE due_probe('console', '{CLAIMED.isoformat()}')"
    ).fetchone()  # type: ignore[misc]
    scans = delivery_scans(by_parent(conn, plan[0]["Plan"]))
    assert scans and set(scans) == {"delivery_due"}, scans
