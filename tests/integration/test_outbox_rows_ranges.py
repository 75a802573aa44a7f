"""The outbox in rows kept in id ranges (0026_outbox_rows_ranges.sql): retention drops a
range's rows and sends with its alerts once it is past the window and every send in it
is settled, prunes a range it must keep row by row, and the delivery and the readers
find rows in every range; rows written before 0026 are kept, in the open range."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_notifier
from slawatch.engine import schema
from slawatch.engine.migrate import migrate
from slawatch.operate.inspect import list_alerts
from slawatch.runtime.maintain import prune
from tests.integration.helpers import Conn, FixedClock
from tests.integration.test_outbox_rows_deliver import hook
from tests.receivers import WebhookReceiver

RETENTION = timedelta(days=7)
DAY = timedelta(days=1)
RULE = "order_unshipped"
SPAN = 1 << 25  # row ids a range


def row(
    conn: Conn,
    fired_at: datetime,
    keys: Sequence[str],
    sends: dict[str, str],
    *,
    kind: str = "firing",
) -> int:
    """One row of ``keys`` fired at ``fired_at``, one send per notifier in the status given."""
    (row_id,) = conn.execute(
        "INSERT INTO slawatch.outbox_row (rule, kind, fired_at, after, notifiers, keys,"
        " episodes, ns, severities, deadlines, row_data)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb[]) RETURNING id",
        (
            RULE,
            kind,
            fired_at,
            DAY,
            list(sends),
            list(keys),
            [1] * len(keys),
            [0 if kind == "resolved" else 1] * len(keys),
            ["warning"] * len(keys),
            [fired_at - 2 * DAY] * len(keys),
            [json.dumps({"id": k}) for k in keys],
        ),
    ).fetchone()
    for notifier, status in sends.items():
        conn.execute(
            "INSERT INTO slawatch.outbox_send (row_id, notifier, status, next_attempt_at)"
            " VALUES (%s, %s, %s, %s)",
            (row_id, notifier, status, fired_at),
        )
    return int(row_id)


def rotate(conn: Conn, now: datetime) -> int | None:
    (n,) = conn.execute(
        "SELECT slawatch.history_rotate(%s, %s)", (now, timedelta(hours=1))
    ).fetchone() or (None,)
    return n


def row_ranges(conn: Conn) -> list[tuple[int, int | None, int | None]]:
    return [
        (int(n), lo, hi)
        for n, lo, hi in conn.execute(
            "SELECT n, row_low, row_high FROM slawatch.history_range ORDER BY n"
        ).fetchall()
    ]


def row_partitions(conn: Conn) -> set[str]:
    return {
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent IN ('slawatch.outbox_row'::regclass,"
            " 'slawatch.outbox_send'::regclass)"
        ).fetchall()
    }


def test_a_settled_range_past_the_window_is_dropped_and_one_with_a_pending_send_pruned_by_row(
    conn: Conn, db: Database
) -> None:
    migrate(conn, [])
    start = datetime.now(UTC)
    assert row_ranges(conn) == [(0, 0, SPAN)]
    # Range 0: settled rows; range 1: one send pending and a settled row; range 2: open.
    gone = [
        row(conn, start, ["1"], {"hook": "sent", "other": "dead"}),
        row(conn, start, ["2"], {"hook": "orphaned"}),
    ]
    assert rotate(conn, start + DAY) == 1
    waiting = row(conn, start + DAY, ["3"], {"hook": "sent", "other": "pending"})
    settled = row(conn, start + DAY, ["4"], {"hook": "sent"})
    assert rotate(conn, start + 2 * DAY) == 2
    fresh = row(conn, start + 2 * DAY, ["5"], {"hook": "sent"})
    # Each range's rows have its ids: the rotation moved the rows' sequence.
    assert max(gone) < SPAN <= waiting < settled < 2 * SPAN <= fresh
    assert row_ranges(conn) == [(0, 0, SPAN), (1, SPAN, 2 * SPAN), (2, 2 * SPAN, 3 * SPAN)]

    now = start + 2 * DAY + RETENTION + timedelta(hours=1)  # ranges 0 and 1 past the window
    result = prune(db, FixedClock(now), RETENTION)
    # Range 0 dropped whole (its partitions gone, no row deleted); range 1 kept for its
    # pending send, its settled old row deleted row by row with its send; range 2 closed
    # only now (the prune rotated first), its row kept for its drop.
    assert (result.ranges, result.rows, result.sends) == (1, 1, 1)
    assert [n for n, _, _ in row_ranges(conn)] == [1, 2, 3]
    assert row_partitions(conn) == {
        f"{t}_h{n}" for t in ("outbox_row", "outbox_send") for n in (1, 2, 3)
    }
    ids = [r[0] for r in conn.execute("SELECT id FROM slawatch.outbox_row ORDER BY id")]
    assert ids == [waiting, fresh]
    assert conn.execute(
        "SELECT notifier, status FROM slawatch.outbox_send WHERE row_id = %s ORDER BY 1",
        (waiting,),
    ).fetchall() == [("hook", "sent"), ("other", "pending")]

    # Once its send is settled, range 1 goes whole.
    conn.execute("UPDATE slawatch.outbox_send SET status = 'sent' WHERE status = 'pending'")
    result = prune(db, FixedClock(now), RETENTION)
    assert (result.ranges, result.rows) == (1, 0)
    assert [n for n, _, _ in row_ranges(conn)] == [2, 3]
    assert [r[0] for r in conn.execute("SELECT id FROM slawatch.outbox_row")] == [fresh]


def test_the_delivery_and_the_readers_find_rows_in_every_range(conn: Conn, db: Database) -> None:
    migrate(conn, [])
    start = datetime.now(UTC)
    # A firing row in range 0, its episode's resolved row in range 1: the resolved one
    # waits for the firing one across the ranges, then both go, in order.
    firing = row(conn, start, ["1", "2"], {"hook": "pending"})
    assert rotate(conn, start + timedelta(hours=2)) == 1
    resolved = row(conn, start + timedelta(hours=2), ["1"], {"hook": "pending"}, kind="resolved")
    assert firing < SPAN <= resolved
    page = list_alerts(conn, rule=RULE)
    assert sorted((a.key, a.kind, a.id) for a in page.alerts) == [
        ("1", "firing", -(firing * 128 + 1)),
        ("1", "resolved", -(resolved * 128 + 1)),
        ("2", "firing", -(firing * 128 + 2)),
    ]
    with WebhookReceiver() as receiver:
        result = deliver_notifier(
            db, hook(receiver.url), FixedClock(start + timedelta(hours=3)), {RULE: "late"}
        )
        sent = [a["id"] for r in receiver.requests for a in r.alerts]
    assert result.sent == 3
    assert sent == [f"{RULE}:1:e1:n1", f"{RULE}:2:e1:n1", f"{RULE}:1:e1:resolved"]
    assert conn.execute(
        "SELECT array_agg(status ORDER BY row_id) FROM slawatch.outbox_send"
    ).fetchone() == (["sent", "sent"],)


def test_rows_written_before_the_ranges_are_kept_in_the_open_range(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = schema.migrations()
    # Those before 0026_outbox_rows_ranges.sql (0027 on add nothing these rows need).
    before = tuple(m for m in shipped if m.version < 26)
    assert [m.version for m in shipped[len(before) :]] == [26, 27], "a migration since: look here"
    monkeypatch.setattr(schema, "migrations", lambda: before)
    migrate(conn, [])
    start = datetime.now(UTC)
    old = [row(conn, start, ["1"], {"hook": "sent"}), row(conn, start, ["2"], {"hook": "pending"})]
    conn.execute("GRANT SELECT ON slawatch.outbox_row TO PUBLIC")
    monkeypatch.undo()
    migrate(conn, [])
    assert row_ranges(conn)[-1][1:] == (0, SPAN)
    assert [r[0] for r in conn.execute("SELECT id FROM slawatch.outbox_row ORDER BY id")] == old
    assert conn.execute(
        "SELECT row_id, status FROM slawatch.outbox_send ORDER BY 1"
    ).fetchall() == [(old[0], "sent"), (old[1], "pending")]
    # In the open range's partitions; the next id follows the old ones; the grant kept.
    assert conn.execute("SELECT count(*) FROM slawatch.outbox_row_h0").fetchone() == (
        2,
    )  # the fresh database's one range
    assert row(conn, start, ["3"], {"hook": "pending"}) == old[1] + 1
    assert conn.execute(
        "SELECT has_table_privilege('public', 'slawatch.outbox_row', 'SELECT')"
    ).fetchone() == (True,)
