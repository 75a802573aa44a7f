"""History in id ranges (0015_rotate.sql, slawatch/engine/rotate.py): retention drops a
whole range once it is past the window and holds nothing kept; a rotation or a drop that
fails is one warning line, the run goes on and the next one tries again; a rotation in
the middle of a drain loses and duplicates nothing; an existing outbox is converted in
batches, keeps every alert and delivery, and a migrate killed in the middle goes on
where it was; an empty one is converted in one transaction.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from slawatch.db import Database, DatabaseUnavailable
from slawatch.engine import rotate as rotate_module
from slawatch.engine import schema
from slawatch.engine.migrate import migrate
from slawatch.engine.outbox import Outbox
from slawatch.engine.queries import queries
from slawatch.engine.ready import prepare
from slawatch.runtime.maintain import prune, prune_ranges
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn, FixedClock, claim_all, history, unrotated
from tests.integration.test_explain import nodes
from tests.integration.test_outage import late_rule, orders
from tests.integration.test_retention import logged
from tests.pgcluster import PgCluster
from tests.waiting import wait_until as wait_for

RETENTION = timedelta(days=7)
DAY = timedelta(days=1)


def alert(conn: Conn, fired_at: datetime, *statuses: str) -> int:
    """An alert fired at ``fired_at`` with one delivery per status (to hook0, hook1, ...)."""
    return history(conn, fired_at, *statuses, notifier="hook")


def rotate(conn: Conn, now: datetime) -> int | None:
    row = conn.execute(
        "SELECT slawatch.history_rotate(%s, %s)", (now, timedelta(hours=1))
    ).fetchone()
    assert row is not None
    return row[0]


def ranges(conn: Conn) -> list[tuple[int, bool]]:
    """(n, closed) of every range, in order."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT n, closed_at IS NOT NULL FROM slawatch.history_range ORDER BY n"
        ).fetchall()
    ]


def partitions(conn: Conn) -> set[str]:
    return {
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent IN ('slawatch.alert'::regclass, 'slawatch.delivery'::regclass)"
        ).fetchall()
    }


def test_a_range_past_the_window_is_dropped_and_one_with_a_pending_delivery_kept(
    conn: Conn, dsn: str
) -> None:
    migrate(conn, [])
    start = datetime.now(UTC)
    # Range 0: sent and dead history; range 1: one delivery still pending; range 2: open.
    gone = [alert(conn, start, "sent"), alert(conn, start, "dead", "sent")]
    assert rotate(conn, start + DAY) == 1
    kept = [alert(conn, start + DAY, "sent"), alert(conn, start + DAY, "sent", "pending")]
    assert rotate(conn, start + 2 * DAY) == 2
    fresh = alert(conn, start + 2 * DAY, "sent")
    assert kept[0] >= 1 << 32 and fresh >= 2 << 32  # each range's ids

    now = start + 2 * DAY + RETENTION + timedelta(hours=1)  # ranges 0 and 1 past the window
    with Database(dsn, size=2) as db:
        result = prune(db, FixedClock(now), RETENTION)
    assert result.ranges == 1
    # The prune rotated first (range 2 was a day old): range 3 is the open one now.
    assert ranges(conn) == [(1, True), (2, True), (3, False)]
    assert partitions(conn) == {f"{t}_h{n}" for t in ("alert", "delivery") for n in (1, 2, 3)}
    ids = {r[0] for r in conn.execute("SELECT id FROM slawatch.alert").fetchall()}
    assert not ids & set(gone)
    # Range 1 is kept for its pending delivery; its old alerts without one go row by
    # row, as before ranges; the alert that may still be sent stays with its deliveries.
    assert ids == {kept[1], fresh}
    assert conn.execute(
        "SELECT count(*) FROM slawatch.delivery WHERE alert_id = %s", (kept[1],)
    ).fetchone() == (2,)

    # Once sent, the range goes whole.
    conn.execute("UPDATE slawatch.delivery SET status = 'sent' WHERE status = 'pending'")
    with Database(dsn, size=2) as db:
        assert prune(db, FixedClock(now), RETENTION).ranges == 1
    assert ranges(conn) == [(2, True), (3, False)]  # range 2 closed only now
    assert {r[0] for r in conn.execute("SELECT id FROM slawatch.alert").fetchall()} == {fresh}


def test_a_range_named_by_a_recent_ack_is_kept(conn: Conn, dsn: str) -> None:
    migrate(conn, [])
    start = datetime.now(UTC)
    acked = alert(conn, start, "sent")
    rotate(conn, start + DAY)
    now = start + DAY + RETENTION + timedelta(hours=1)
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, %s, 'ana' FROM slawatch.alert WHERE id = %s",
        (now - timedelta(hours=2), acked),
    )
    with Database(dsn, size=2) as db:
        assert prune(db, FixedClock(now), RETENTION).ranges == 0
    assert ranges(conn) == [(0, True), (1, True), (2, False)]
    assert conn.execute("SELECT count(*) FROM slawatch.alert").fetchone() == (1,)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """slawatch's warning (and worse) lines."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("slawatch")
    ]


def ack(conn: Conn, alert_id: int, at: datetime) -> None:
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, %s, 'ana' FROM slawatch.alert WHERE id = %s",
        (at, alert_id),
    )


def test_a_drop_that_cannot_lock_its_range_is_one_warning_and_the_run_goes_on(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A long reader of an old range's partition: its DROP waits out history_drop's
    lock_timeout. That is one warning line; nothing of the range goes with the failed
    call (its old acks neither); the run goes on (the batches take its old alerts row
    by row) and the next run drops it."""
    caplog.set_level(logging.INFO, logger="slawatch")
    migrate(conn, [])
    start = datetime.now(UTC)
    old = [alert(conn, start, "sent") for _ in range(3)]
    ack(conn, old[0], start + timedelta(hours=1))
    assert rotate(conn, start + DAY) == 1
    alert(conn, start + DAY, "sent")
    assert rotate(conn, start + 2 * DAY) == 2
    now = start + 2 * DAY + RETENTION + timedelta(hours=1)  # ranges 0 and 1 past the window
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM slawatch.alert_h0")  # its transaction stays open
        with pytest.raises(psycopg.errors.LockNotAvailable):
            conn.execute("SELECT * FROM slawatch.history_drop(%s)", (now - RETENTION,))
        assert conn.execute("SELECT count(*) FROM slawatch.ack").fetchone() == (1,)
        assert ranges(conn) == [(0, True), (1, True), (2, False)]

        with Database(dsn, size=2) as db:
            result = prune(db, FixedClock(now), RETENTION)
        (line,) = warnings(caplog)
        assert "dropping an alert history range" in line and "lock timeout" in line, line
        assert "the next run tries again" in line
        assert result.ranges == 0 and result.alerts == 4  # row by row, range 0 included
        assert ranges(conn) == [(0, True), (1, True), (2, True), (3, False)]  # rotated
        assert conn.execute("SELECT count(*) FROM slawatch.ack").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM slawatch.alert").fetchone() == (0,)
    caplog.clear()
    with Database(dsn, size=2) as db:
        assert prune(db, FixedClock(now), RETENTION).ranges == 2
    assert warnings(caplog) == []
    assert ranges(conn) == [(2, True), (3, False)]


def test_a_rotation_that_cannot_lock_the_outbox_is_one_warning_and_the_run_goes_on(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A long reader of the whole outbox: the rotation's CREATE TABLE ... PARTITION OF
    and the drop's DROP TABLE both wait out their lock_timeout. Each is one warning
    line, the job's run goes on, and the next run rotates and drops."""
    caplog.set_level(logging.INFO, logger="slawatch")
    migrate(conn, [])
    start = datetime.now(UTC)
    alert(conn, start, "sent")
    assert rotate(conn, start + DAY) == 1
    now = start + DAY + RETENTION + timedelta(hours=1)  # range 0 past the window
    runner = Runner(dsn, [], [], clock=FixedClock(now), retention=RETENTION)
    try:
        with psycopg.connect(dsn) as reader:
            reader.execute("SELECT count(*) FROM slawatch.alert")  # its transaction stays open
            result = runner.maintain()
            assert result is not None  # the job's run went on to its end
            lines = warnings(caplog)
            assert len(lines) == 2, lines
            assert "rotating alert history" in lines[0] and "lock timeout" in lines[0]
            assert "dropping an alert history range" in lines[1] and "lock timeout" in lines[1]
            assert result.ranges == 0 and result.alerts == 1  # the old alert went row by row
            assert ranges(conn) == [(0, True), (1, False)]
        caplog.clear()
        result = runner.maintain()
    finally:
        runner.close()
    assert result is not None and result.ranges == 1
    assert warnings(caplog) == []
    assert logged(caplog, "opened alert history range 2") == 1
    assert ranges(conn) == [(1, True), (2, False)]


def test_a_range_whose_partition_was_dropped_by_hand_is_forgotten(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator dropped an old range's alert partition: its drop drops what is left
    and forgets the range, where it failed at every run on the missing table."""
    caplog.set_level(logging.INFO, logger="slawatch")
    migrate(conn, [])
    start = datetime.now(UTC)
    alert(conn, start, "sent")
    assert rotate(conn, start + DAY) == 1
    kept = alert(conn, start + DAY, "sent")
    conn.execute("DROP TABLE slawatch.alert_h0")
    now = start + DAY + RETENTION + timedelta(hours=1)  # range 0 past the window
    with Database(dsn, size=2) as db:
        result = prune(db, FixedClock(now), RETENTION)
    assert warnings(caplog) == []
    assert result.ranges == 1
    assert ranges(conn) == [(1, True), (2, False)]
    assert partitions(conn) == {f"{t}_h{n}" for t in ("alert", "delivery") for n in (1, 2)}
    assert {r[0] for r in conn.execute("SELECT id FROM slawatch.alert").fetchall()} == {kept}


def test_a_database_away_stops_the_run_with_no_warning_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Unreachable, nothing else of the run could go on: the rotation's failure is the
    outage (its own line, once), raised as such; no rotation warning beside it."""
    caplog.set_level(logging.INFO, logger="slawatch")
    with PgCluster() as cluster:
        dsn = cluster.database(f"rotate_{uuid.uuid4().hex[:8]}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, [])
        with Database(dsn, size=1, timeout=1.0) as db:
            cluster.stop()
            with pytest.raises(DatabaseUnavailable):
                prune(db, FixedClock(datetime.now(UTC)), RETENTION)
    assert logged(caplog, "database unreachable: pruning alert history") == 1
    assert not [line for line in warnings(caplog) if "the next run tries again" in line]


# The same count of either shape of the outbox: (alerts, distinct keys, ranges they
# are in, deliveries or sends, alerts or rows delivered). A range holds 2^32 alert ids
# and 2^25 row ids (docs/explanation/outbox-rows.md#retention).
DRAINED = {
    "alerts": "SELECT count(*), count(DISTINCT key), count(DISTINCT id >> 32),"
    " (SELECT count(*) FROM slawatch.delivery),"
    " (SELECT count(DISTINCT alert_id) FROM slawatch.delivery)"
    " FROM slawatch.alert",
    "rows": "SELECT count(*), count(DISTINCT u.key), count(DISTINCT r.id >> 25),"
    " (SELECT count(*) FROM slawatch.outbox_send),"
    " (SELECT count(DISTINCT row_id) FROM slawatch.outbox_send)"
    " FROM slawatch.outbox_row r, unnest(r.keys) AS u(key)",
}


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
def test_a_rotation_in_the_middle_of_a_drain_loses_and_duplicates_nothing(
    conn: Conn, dsn: str, outbox: Outbox
) -> None:
    orders(conn)
    rule = late_rule().model_copy(update={"batch": 50})
    plan = prepare(conn, rule, outbox=outbox)
    now = datetime.now(UTC)
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', %s - interval '1 day'"
        " FROM generate_series(1, 3000) g",
        (now,),
    )
    opened: list[int] = []
    stop = threading.Event()

    def rotating() -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            at = now
            while not stop.is_set():
                at += timedelta(hours=2)
                got = rotate(other, at)
                if got is not None:
                    opened.append(got)

    thread = threading.Thread(target=rotating, daemon=True)
    thread.start()
    try:
        claimed = claim_all(conn, plan, now)
    finally:
        stop.set()
        thread.join(30)
    assert claimed == 3000
    assert len(opened) >= 2, opened  # the drain crossed boundaries
    row = conn.execute(DRAINED[outbox]).fetchone()
    assert row is not None
    alerts, keys, spread, deliveries, delivered = row
    # One notifier: a delivery per alert, or a send per row of 50 (the batch).
    units = 3000 if outbox == "alerts" else 3000 // 50
    assert (alerts, keys, deliveries, delivered) == (3000, 3000, units, units)
    assert spread >= 2
    # A second drain finds nothing left to claim (the rows' state moved on with them).
    assert claim_all(conn, plan, now) == 0


CONVERT = """
import sys, psycopg
from slawatch.clock import Clock
from slawatch.engine import rotate, schema
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    for change in schema.pending(conn):
        schema.apply(conn, change, Clock().now())
    rotate.convert(conn, batch=int(sys.argv[2]))
"""


def test_an_outbox_with_history_is_converted_and_a_killed_migrate_resumes(
    conn: Conn, dsn: str
) -> None:
    migrate(conn, [])
    unrotated(conn)  # the outbox as the release before this one left it
    assert conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = 'slawatch.alert'::regclass"
    ).fetchone() == ("r",)
    start = datetime.now(UTC) - 5 * DAY
    # 4,000 alerts over five days, two deliveries each in every status.
    conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " SELECT 'late', g::text, 1, 1, 'warning', %s + g * interval '108 seconds',"
        " jsonb_build_object('id', g) FROM generate_series(1, 4000) g",
        (start,),
    )
    conn.execute(
        "INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)"
        " SELECT id, h, (ARRAY['sent', 'dead', 'pending', 'silenced'])[1 + mod(id, 4)],"
        " fired_at FROM slawatch.alert, unnest(ARRAY['hook', 'mail']) h"
    )

    def snapshot() -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        return (
            conn.execute("SELECT * FROM slawatch.alert ORDER BY id").fetchall(),
            conn.execute(
                "SELECT id, alert_id, notifier, status, attempts, sent_at FROM slawatch.delivery"
                " ORDER BY id"
            ).fetchall(),
        )

    child = subprocess.Popen(
        [sys.executable, "-c", CONVERT, dsn, "10"],
        env=os.environ | {"PYTHONPATH": os.getcwd()},
    )
    try:
        # Stop it in the middle of the copy: let some batches commit, then hold the
        # progress row so the next batch waits, and kill it there.
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT to_regclass('slawatch.history_convert') IS NOT NULL"
                ).fetchone()
                == (True,)
                and (
                    conn.execute("SELECT alert_done FROM slawatch.history_convert").fetchone()
                    or (0,)
                )[0]
                >= 500
            ),
            "some batches to be copied",
        )
        with psycopg.connect(dsn) as holder:
            holder.execute("LOCK TABLE slawatch.history_convert IN ACCESS EXCLUSIVE MODE")
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock' AND query LIKE '%%history_convert%%'"
                    ).fetchone()
                    == (1,)
                ),
                "the migrate to wait for its next batch",
            )
            child.send_signal(signal.SIGKILL)
            child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    row = conn.execute(
        "SELECT alert_done, alert_upto, swapped_at FROM slawatch.history_convert"
    ).fetchone()
    assert row is not None
    assert 0 < row[0] < row[1] and row[2] is None  # killed half-way through the copy

    # While it is down the application goes on on the old tables: new alerts, a
    # delivery sent, an old alert's delivery replayed; the triggers mirror each.
    new = alert(conn, datetime.now(UTC), "pending")
    conn.execute("UPDATE slawatch.delivery SET status = 'sent' WHERE alert_id = %s", (new,))
    conn.execute(
        "UPDATE slawatch.delivery SET status = 'pending', attempts = 0"
        " WHERE status = 'dead' AND alert_id = (SELECT max(alert_id) FROM slawatch.delivery"
        " WHERE status = 'dead')"
    )
    conn.execute("DELETE FROM slawatch.delivery WHERE alert_id = 2")
    before = snapshot()

    done = migrate(conn, [])
    assert any("converted into id ranges" in line for line in done), done
    assert conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = 'slawatch.alert'::regclass"
    ).fetchone() == ("p",)
    assert snapshot() == before
    # One range per day of the old history, the open one after them.
    closed = conn.execute(
        "SELECT count(*) FILTER (WHERE closed_at IS NOT NULL), count(*) FILTER"
        " (WHERE closed_at IS NULL) FROM slawatch.history_range"
    ).fetchone()
    assert closed is not None and closed[0] >= 5 and closed[1] == 1
    # The identities go on after the old ids; nothing is left to convert.
    after = alert(conn, datetime.now(UTC), "pending")
    assert after > new
    assert migrate(conn, []) == []
    assert conn.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'history_mirror'"
    ).fetchone() == (0,)


@pytest.mark.empty_database
def test_an_empty_outbox_is_converted_in_one_transaction(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh database (and any whose old outbox is empty): no mirror triggers, no
    batches, no swap of its own: slawatch.history_convert_all, as psql's script runs
    it; the same ranges, and the identities go on after the ids the old tables drew."""
    caplog.set_level(logging.INFO, logger="slawatch")
    done = migrate(conn, [])
    assert "slawatch.alert, slawatch.delivery: converted into id ranges (0 rows)" in done
    assert logged(caplog, "converting the outbox: empty, converted in one transaction") == 1
    assert logged(caplog, "to copy") == 0  # the steps' first line
    fresh = conn.execute("SELECT n, low, high, closed_at FROM slawatch.history_range").fetchall()
    assert fresh == [(0, 0, 1 << 32, None)]
    # 0016_rotate_retry.sql dropped what nothing used.
    assert conn.execute(
        "SELECT to_regprocedure('slawatch.history_lo(timestamptz)'),"
        " to_regprocedure('slawatch.history_hi(timestamptz)')"
    ).fetchone() == (None, None)

    # An upgraded database whose old outbox is empty now, its ids drawn up to 5.
    unrotated(conn)
    caplog.clear()
    for _ in range(5):
        alert(conn, datetime.now(UTC), "sent")
    conn.execute("DELETE FROM slawatch.delivery; DELETE FROM slawatch.alert")
    migrate(conn, [])
    assert logged(caplog, "converting the outbox: empty, converted in one transaction") == 1
    assert conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = 'slawatch.alert'::regclass"
    ).fetchone() == ("p",)
    assert conn.execute(
        "SELECT n, low, high, closed_at FROM slawatch.history_range"
    ).fetchall() == [(0, 0, 1 << 32, None)]
    assert alert(conn, datetime.now(UTC), "pending") == 6
    assert conn.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgname IN ('history_mirror', 'action_settled')"
        " AND tgrelid = 'slawatch.delivery'::regclass"
    ).fetchone() == (1,)


def test_retention_prunes_each_kept_range_by_itself_reading_one_partition(
    conn: Conn, dsn: str
) -> None:
    """Several ranges kept past their turn (a pending delivery in each): the row-by-row
    prune goes through them one at a time, and each batch reads that range's partitions
    only -- over all kept ranges at once, the planner merged and sorted every one."""
    migrate(conn, [])
    start = datetime.now(UTC)
    kept: dict[int, list[int]] = {}
    gone: list[int] = []
    n: int | None = 0  # the open range migrate made
    for day in range(4):
        assert n is not None
        gone += [alert(conn, start + day * DAY, "sent") for _ in range(20)]
        kept[n] = [alert(conn, start + day * DAY, "sent", "pending")]
        n = rotate(conn, start + (day + 1) * DAY)
    now = start + 4 * DAY + RETENTION + timedelta(hours=1)  # the four closed ranges past it
    fresh = alert(conn, now, "sent")  # in the open range
    conn.execute("ANALYZE slawatch.alert")
    conn.execute("ANALYZE slawatch.delivery")
    cutoff = now - RETENTION
    todo = prune_ranges(conn, cutoff)
    bounds = {
        r[0]: (r[1], r[2])
        for r in conn.execute("SELECT n, low, high FROM slawatch.history_range").fetchall()
    }
    assert [bounds[n] for n in kept] == todo[: len(kept)]  # the kept ranges, oldest first
    for n in kept:
        lo, hi = bounds[n]
        with conn.transaction(force_rollback=True):
            row = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + queries()["prune_history"],
                {"cutoff": cutoff, "batch": 5000, "lo": lo, "hi": hi},
            ).fetchone()
        assert row is not None
        read = {
            node["Relation Name"]
            for node in nodes(row[0][0]["Plan"])
            if node.get("Relation Name", "").startswith(("alert_h", "delivery_h"))
            and node.get("Actual Loops", 1) > 0
        }
        assert read == {f"alert_h{n}", f"delivery_h{n}"}, read

    with Database(dsn, size=2) as db:
        result = prune(db, FixedClock(now), RETENTION)
    assert result.ranges == 0 and result.alerts == len(gone)
    ids = {r[0] for r in conn.execute("SELECT id FROM slawatch.alert").fetchall()}
    assert ids == {fresh, *(i for v in kept.values() for i in v)}


def read_partitions(plan: dict[str, Any], table: str) -> set[str]:
    """The partitions of ``table`` (and their indexes) that ``plan`` read."""
    return {
        m.group(0)
        for node in nodes(plan)
        if node.get("Actual Loops", 1) > 0
        for field in ("Relation Name", "Index Name")
        if (m := re.match(table + r"_h\d+", node.get(field, "")))
    }


def test_settling_deliveries_reads_only_their_ranges_partitions(conn: Conn) -> None:
    """delivery.id has no index (0018_lean_outbox.sql), in no range, the ranges opened
    since included: by id alone, a settle would read every range. With the alert ids
    the dispatcher has, it reads their ranges' partitions only (delivery_once): in
    mark_sent, mark_retry, mark_dead, and in the claim the settle of the batch sent
    (`sent`), the lease of the due deliveries (`leased`) and the settle of the silenced
    or acknowledged ones (`settled`)."""
    migrate(conn, [])
    start = datetime.now(UTC)
    for day in range(3):  # history, as many rows as make index probes the plan's choice
        conn.execute(
            "WITH a AS (INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at,"
            " row_data) SELECT 'late', g::text, 1, 1, 'warning', %(at)s, '{}'"
            " FROM generate_series(1, 20000) g RETURNING id)"
            " INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)"
            " SELECT id, 'hook0', 'sent', %(at)s FROM a",
            {"at": start + day * DAY},
        )
        assert rotate(conn, start + (day + 1) * DAY) is not None
    # No index of the outbox's deliveries is led by id, in any of the 4 ranges.
    assert conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE a.attname = 'id')"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE c.relname LIKE 'delivery_h%'"
    ).fetchone() == (4 * 5, 0)
    mine = alert(conn, start + 3 * DAY, "pending")  # in the open range, 3
    alert(conn, start + 3 * DAY, "pending")  # due: leased by the claim
    acked = alert(conn, start + 3 * DAY, "pending")  # settled by the claim
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, %s, 'me' FROM slawatch.alert WHERE id = %s",
        (start, acked),
    )
    owner = uuid.uuid4()
    conn.execute("UPDATE slawatch.delivery SET lease_owner = %s WHERE alert_id = %s", (owner, mine))
    conn.execute("ANALYZE slawatch.alert, slawatch.delivery")
    (delivery,) = conn.execute(
        "SELECT id FROM slawatch.delivery WHERE alert_id = %s", (mine,)
    ).fetchone()  # type: ignore[misc]
    q = queries()
    later = start + 3 * DAY
    common = {"owner": owner, "now": later, "error": "x", "nexts": [later]}
    claim = {"limit": 10, "lease": timedelta(seconds=30), "notifier": "hook0"}
    cases = {
        "mark_sent": {"ids": [delivery], "alerts": [mine]} | common,
        "mark_retry": {"ids": [delivery], "alerts": [mine]} | common,
        "mark_dead": {"ids": [delivery], "alerts": [mine]} | common,
        "claim_deliveries": claim
        | {"sent": [delivery], "sent_alerts": [mine], "sent_owner": owner}
        | {"now": later, "owner": uuid.uuid4()},
    }
    for name, params in cases.items():
        with conn.transaction(force_rollback=True):
            row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + q[name], params).fetchone()
        assert row is not None
        plan = row[0][0]["Plan"]
        if name != "claim_deliveries":
            (fed,) = [n for n in plan["Plans"] if n.get("Parent Relationship") == "Outer"]
            assert fed["Actual Rows"] == 1, name  # the delivery, settled
            read = read_partitions(plan, "delivery")
            assert read == {"delivery_h3"}, (name, read)
            continue
        # Its writes (the due rows are read in order through every range's delivery_due).
        ctes = {n["Subplan Name"]: n for n in nodes(plan) if "Subplan Name" in n}
        for cte in ("sent", "leased", "settled"):
            read = read_partitions(ctes[f"CTE {cte}"], "delivery")
            assert read == {"delivery_h3"}, (cte, read)
            assert ctes[f"CTE {cte}"]["Actual Rows"] == 1, cte


def test_a_conversion_that_cannot_lock_the_outbox_waits_for_it_by_its_sqlstate(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader of the old outbox holds it: converting it empty in one transaction
    gives up at its lock_timeout, changing nothing, and the steps go on until the swap,
    which tries its lock again until the reader is gone. The lock timeout is told by
    its SQLSTATE (55P03), not by the server's text, which follows its lc_messages."""
    caplog.set_level(logging.INFO, logger="slawatch")
    monkeypatch.setattr(rotate_module, "LOCK_TIMEOUT", "50ms")
    migrate(conn, [])
    unrotated(conn)
    for change in schema.pending(conn):  # the migrations, not yet the conversion
        schema.apply(conn, change, datetime.now(UTC))
    caplog.clear()
    errors: list[BaseException] = []

    def converting() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as other:
                rotate_module.convert(other)
        except BaseException as exc:  # the test's assertion, below
            errors.append(exc)

    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM slawatch.alert")  # its transaction stays open
        thread = threading.Thread(target=converting, daemon=True)
        thread.start()
        wait_for(lambda: logged(caplog, "trying the swap again") >= 1, "the swap to wait")
        assert conn.execute(
            "SELECT relkind FROM pg_class WHERE oid = 'slawatch.alert'::regclass"
        ).fetchone() == ("r",)
    thread.join(30)
    assert errors == [] and not thread.is_alive()
    assert logged(caplog, "converted in one transaction") == 0  # the steps did it
    assert conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = 'slawatch.alert'::regclass"
    ).fetchone() == ("p",)
