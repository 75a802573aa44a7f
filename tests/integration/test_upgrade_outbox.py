"""An upgrade from the release before issue 27's outbox changes (its migrations end at
0016_rotate_retry.sql) to 0017_deliveries_due.sql, 0018_lean_outbox.sql and
0019_history_drop_locked.sql (which replaces a function and moves no row), with
history in the outbox: every alert, delivery (pending, leased, retrying, sent, dead),
open episode and event timer is kept as it was, and what was pending is delivered
once after it. Also across a conversion into id ranges that the release before started
in batches and was killed in (0018 drops the new tables' id index under it).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import sql

from slawatch.actions.run import runner
from slawatch.clock import Clock
from slawatch.config.notifiers import ConsoleConfig
from slawatch.db import Database
from slawatch.delivery.dispatcher import deliver_notifier, deliveries_due
from slawatch.delivery.notifiers.base import BaseNotifier
from slawatch.engine import rotate, schema
from slawatch.engine.migrate import migrate, schema_current
from slawatch.engine.ready import prepare
from tests.integration.helpers import (
    Conn,
    FixedClock,
    claim_all,
    history,
    shop,
    unrotated,
)

# Tests of upgrading: each test's database starts empty (tests/conftest.py), and the
# release before migrates it first.
pytestmark = pytest.mark.empty_database

PREVIOUS = 16  # the migrations of the release before 0017_deliveries_due.sql
H = timedelta(hours=1)


class Receiver(BaseNotifier):
    """Keeps the ids of what it is sent, in order."""

    def __init__(self, name: str) -> None:
        super().__init__(ConsoleConfig(name=name, type="console"))
        self.got: list[str] = []

    def send(self, alerts: list[dict[str, Any]]) -> None:
        self.got.extend(a["id"] for a in alerts)


def previous_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """schema.migrations() as the release before 0017 shipped them, until ``upgrade()``."""
    shipped = schema.migrations()
    assert [m.version for m in shipped[PREVIOUS:]] == [
        17,
        18,
        19,
        20,
        21,
        22,
        23,
        24,
        25,
        26,
        27,
    ], "a migration since: look here"
    monkeypatch.setattr(schema, "migrations", lambda: shipped[:PREVIOUS])


def upgrade(monkeypatch: pytest.MonkeyPatch, conn: Conn, rules: list[Any]) -> list[str]:
    """``slawatch migrate`` by this release."""
    monkeypatch.undo()  # today's migrations (and whatever else the test patched)
    assert not schema_current(conn)
    done = migrate(conn, rules)
    assert schema_current(conn)
    return done


def contents(conn: Conn) -> dict[str, list[str]]:
    """Every row of every table of slawatch's schema and of the watched tables (the
    inline tracking columns with them), as sorted JSON text: partitions through their
    parents; the record of applied migrations left out."""
    tables = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname IN ('slawatch', 'public') AND c.relkind IN ('r', 'p')"
        " AND NOT c.relispartition AND c.relname <> 'schema_version'"
    ).fetchall()
    return {
        f"{ns}.{name}": [
            r[0]
            for r in conn.execute(
                sql.SQL("SELECT to_jsonb(t)::text FROM {} t ORDER BY 1").format(
                    sql.Identifier(ns, name)
                )
            ).fetchall()
        ]
        for ns, name in tables
    }


def id_indexes(conn: Conn) -> list[str]:
    """Indexes on the partitioned outbox's deliveries (its ranges' too) led by
    delivery.id (the plain table of before 0015 keeps its primary key until the swap)."""
    return sorted(
        r[0]
        for r in conn.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indrelid"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]"
            " WHERE c.relnamespace = 'slawatch'::regnamespace AND a.attname = 'id'"
            " AND c.relname LIKE 'delivery%%' AND (c.relkind = 'p' OR c.relispartition)"
        ).fetchall()
    )


def test_a_database_of_the_release_before_keeps_every_alert_and_delivers_what_was_pending(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous_release(monkeypatch)
    rules = shop(conn)  # migrated by the release before: the outbox in id ranges
    assert conn.execute("SELECT count(*) FROM slawatch.schema_version").fetchone() == (PREVIOUS,)
    assert id_indexes(conn) == ["slawatch.delivery_h0_id_idx", "slawatch.delivery_id"]
    # The release before had only today's outbox: its claims write alerts.
    claims = {
        name: prepare(conn, r, outbox="alerts").with_act(runner("off")) for name, r in rules.items()
    }
    now = Clock().now()
    # History in three id ranges: overdue orders claimed (one open episode and one
    # pending delivery each), then a rotation, twice; event timers, some paged.
    for step in range(3):
        conn.execute(
            "INSERT INTO orders SELECT g, 7, 990, 'paid', %s"
            " FROM generate_series(%s::int, %s::int) g",
            (now - 5 * 24 * H, step * 100 + 1, step * 100 + 100),
        )
        for key in range(step * 10, step * 10 + 10):
            conn.execute(
                "SELECT slawatch.event_at(%s, 'parcel_shipped', %s, %s, NULL, NULL)",
                (now, f"P{key}", now - (80 * H if key % 2 else H)),
            )
        assert claim_all(conn, claims["order_unshipped"], now) == 100
        assert claim_all(conn, claims["parcel_undelivered"], now) == 5
        if step < 2:
            assert conn.execute(
                "SELECT slawatch.history_rotate(%s, %s)", (now + (step + 1) * H, H)
            ).fetchone() == (step + 1,)
    # Deliveries in every state: sent, dead, retrying later, leased by a worker that is
    # gone (its lease runs out in an hour), and pending.
    conn.execute(
        "UPDATE slawatch.delivery SET status = CASE WHEN alert_id %% 5 = 0 THEN 'sent'"
        " WHEN alert_id %% 5 = 1 THEN 'dead' ELSE status END,"
        " sent_at = CASE WHEN alert_id %% 5 = 0 THEN %(now)s END,"
        " attempts = CASE WHEN alert_id %% 5 = 1 THEN 5 WHEN alert_id %% 5 = 2 THEN 2 ELSE 0 END,"
        " last_error = CASE WHEN alert_id %% 5 IN (1, 2) THEN '503' END,"
        " next_attempt_at = CASE WHEN alert_id %% 5 = 2 THEN %(now)s + interval '10 minutes'"
        " ELSE next_attempt_at END,"
        " lease_owner = CASE WHEN alert_id %% 5 = 3 THEN %(owner)s END,"
        " lease_expires_at = CASE WHEN alert_id %% 5 = 3 THEN %(now)s + interval '1 hour' END",
        {"now": now, "owner": uuid.uuid4()},
    )
    # One more alert the old way (helpers.history), pending to a second receiver.
    extra = history(conn, now, "pending", rule="order_unshipped", notifier="other")
    ranges = conn.execute("SELECT count(DISTINCT n) FROM slawatch.history_range").fetchone()
    assert ranges == (3,)
    deliveries = dict(
        conn.execute(
            "SELECT CASE WHEN status <> 'pending' THEN status WHEN lease_owner IS NOT NULL"
            " THEN 'leased' WHEN attempts > 0 THEN 'retrying' ELSE 'pending' END, count(*)"
            " FROM slawatch.delivery GROUP BY 1"
        ).fetchall()
    )
    assert set(deliveries) == {"sent", "dead", "retrying", "leased", "pending"}, deliveries
    timers = conn.execute("SELECT count(*) FROM slawatch.parcel_undelivered_timers").fetchone()
    assert timers == (30,)
    pending: dict[str, list[str]] = {"due": [], "retrying": [], "leased": []}
    for rule, key, episode, n, leased, later in conn.execute(
        "SELECT a.rule, a.key, a.episode, a.n, d.lease_owner IS NOT NULL, d.next_attempt_at > %s"
        " FROM slawatch.alert a JOIN slawatch.delivery d ON d.alert_id = a.id"
        " WHERE d.status = 'pending' AND d.notifier = 'console'",
        (now,),
    ).fetchall():
        which = "leased" if leased else "retrying" if later else "due"
        pending[which].append(f"{rule}:{key}:e{episode}:n{n}")
    assert all(pending.values()), pending
    before = contents(conn)

    done = upgrade(monkeypatch, conn, list(rules.values()))
    assert done[:2] == [
        "slawatch's schema: applied 0017_deliveries_due.sql",
        "slawatch's schema: applied 0018_lean_outbox.sql",
    ], done
    # Every row kept; the tables of migrations since are new, and empty.
    after = contents(conn)
    assert after.pop("slawatch.outbox_row") == after.pop("slawatch.outbox_send") == []
    # 0023_outbox_rows_calendar.sql's column of the history: NULL in every row kept.
    episodes = [json.loads(r) for r in after.pop("slawatch.episode")]
    assert all(e.pop("resolved_notice_at") is None for e in episodes)
    assert sorted(episodes, key=json.dumps) == sorted(
        (json.loads(r) for r in before.pop("slawatch.episode")), key=json.dumps
    )
    # 0026_outbox_rows_ranges.sql's columns of the ranges: the open one (the newest) takes
    # the rows, from 0; the ranges opened before hold none.
    ranges = sorted(
        (json.loads(r) for r in after.pop("slawatch.history_range")), key=lambda r: r["n"]
    )
    assert [(r.pop("row_low"), r.pop("row_high")) for r in ranges] == [(None, None)] * (
        len(ranges) - 1
    ) + [(0, 1 << 25)]
    assert ranges == sorted(
        (json.loads(r) for r in before.pop("slawatch.history_range")), key=lambda r: r["n"]
    )
    assert after == before
    assert id_indexes(conn) == []

    # Delivered after it: every pending delivery once (the retrying ones when due, the
    # leased ones once their lease is over), nothing sent or dead again.
    console, other = Receiver("console"), Receiver("other0")
    with Database(dsn, size=2, timeout=10) as db:
        for at, which in ((now, "due"), (now + H / 3, "retrying"), (now + 2 * H, "leased")):
            assert deliveries_due(db, console, at)
            got = len(console.got)
            assert deliver_notifier(db, console, FixedClock(at)).sent == len(pending[which])
            assert sorted(console.got[got:]) == sorted(pending[which]), which
            assert not deliveries_due(db, console, at)
        assert deliver_notifier(db, other, FixedClock(now)).sent == 1
    assert len(console.got) == len(set(console.got))
    assert other.got == [
        f"order_unshipped:{key}:e1:n1"
        for (key,) in conn.execute(
            "SELECT key FROM slawatch.alert WHERE id = %s", (extra,)
        ).fetchall()
    ]
    assert dict(
        conn.execute("SELECT status, count(*) FROM slawatch.delivery GROUP BY 1").fetchall()
    ) == {"sent": deliveries["sent"] + len(console.got) + 1, "dead": deliveries["dead"]}


def _interrupt_after(copied: int) -> tuple[Any, type[Exception]]:
    """A stand-in for rotate's log that raises at its ``copied``-th "copied" line (each
    follows a committed batch): a migrate killed between two batches."""

    class Killed(Exception):
        pass

    class Log:
        seen = 0

        def info(self, message: str, *args: Any) -> None:
            if "copied" in message:
                Log.seen += 1
                if Log.seen >= copied:
                    raise Killed(message % args)

    return Log(), Killed


def test_a_conversion_the_release_before_was_killed_in_is_finished_by_this_one(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release before converted an outbox with history into id ranges in batches
    and was killed halfway through the deliveries' copy (delivery_rotating_id, 0015's
    index of the new table's ids, there); the application went on writing on the old
    tables; this release's migrate drops that index (0018) and finishes the copy and the
    swap: every alert and delivery kept, none led by id, the ids going on."""
    migrate(conn, [])
    unrotated(conn)  # the outbox as 0013_scan_heartbeat.sql left it: plain tables
    start = datetime.now(UTC) - 3 * 24 * H
    conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " SELECT 'late', g::text, 1, 1, 'warning', %s + g * interval '1 minute',"
        " jsonb_build_object('id', g) FROM generate_series(1, 3000) g",
        (start,),
    )
    conn.execute(
        "INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at,"
        " lease_owner, lease_expires_at)"
        " SELECT id, h, (ARRAY['sent', 'dead', 'pending', 'pending'])[1 + mod(id, 4)],"
        " fired_at, CASE WHEN mod(id, 4) = 3 THEN gen_random_uuid() END,"
        " CASE WHEN mod(id, 4) = 3 THEN fired_at + interval '1 hour' END"
        " FROM slawatch.alert, unnest(ARRAY['hook', 'mail']) h"
    )
    # The release before: its migrations (0014 to 0016), then its conversion, killed
    # after the alerts' 300 batches and 300 of the deliveries' 600 (10 ids a batch).
    previous_release(monkeypatch)
    for change in schema.pending(conn):
        schema.apply(conn, change, Clock().now())
    assert id_indexes(conn) == ["slawatch.delivery_rotating_id"]
    log, killed = _interrupt_after(300 + 300)
    monkeypatch.setattr(rotate, "log", log)
    with pytest.raises(killed):
        rotate.convert(conn, batch=10)
    row = conn.execute(
        "SELECT alert_done = alert_upto, delivery_done, delivery_upto, swapped_at"
        " FROM slawatch.history_convert"
    ).fetchone()
    assert row is not None and row[0] and 0 < row[1] < row[2] and row[3] is None, row
    # Meanwhile on the old tables (the mirror triggers copy each): a new alert, a
    # delivery sent, two dead ones replayed (one copied, one not yet), one deleted.
    new = history(conn, datetime.now(UTC), "pending", notifier="hook")
    conn.execute("UPDATE slawatch.delivery SET status = 'sent' WHERE alert_id = %s", (new,))
    conn.execute(
        "UPDATE slawatch.delivery SET status = 'pending', attempts = 0"
        " WHERE status = 'dead' AND alert_id IN (1, 2997)"
    )
    conn.execute("DELETE FROM slawatch.delivery WHERE alert_id = 2")

    def outbox() -> tuple[list[Any], list[Any]]:
        return (
            conn.execute("SELECT * FROM slawatch.alert ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM slawatch.delivery ORDER BY alert_id, id").fetchall(),
        )

    before = outbox()
    done = upgrade(monkeypatch, conn, [])
    assert any("converted into id ranges" in line for line in done), done
    assert conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = 'slawatch.delivery'::regclass"
    ).fetchone() == ("p",)
    assert outbox() == before
    assert id_indexes(conn) == []
    assert history(conn, datetime.now(UTC), "pending", notifier="hook") > new
    assert migrate(conn, []) == []
