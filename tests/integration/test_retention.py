"""Outbox lifecycle: history older than the retention goes, in bounded batches; what
may still be sent stays; acks go with their alerts (never after them) and silences a
window after they ended; the job of ``slawatch run`` outlives failures and outages.

The cost argument is proved with plans and sizes, not timings: a batch reads the
old rows through indexes (never a scan of a table), and a long run's outbox stays
the size of the retention window, so the claim's inserts do not grow with the run.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from slawatch.clock import Clock
from slawatch.db import Database
from slawatch.engine.migrate import migrate, schema_current
from slawatch.engine.queries import queries
from slawatch.engine.ready import prepare
from slawatch.runtime.maintain import prune
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn, claim_all, history, unrotated
from tests.integration.test_explain import nodes
from tests.integration.test_outage import FaultyClock, late_rule, orders
from tests.pgcluster import PgCluster

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
DAY = timedelta(days=1)
# Every alert id: prune_history over the whole outbox (its one range, here).
ALL = {"lo": -(2**63), "hi": 2**63 - 1}
RETENTION = timedelta(days=30)


class FixedClock(Clock):
    """The application clock at a time the test sets."""

    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


def kept(conn: Conn) -> tuple[set[int], set[tuple[int, str]]]:
    """Alert ids, and (alert id, status) of deliveries, still in the outbox."""
    alert_ids = {r[0] for r in conn.execute("SELECT id FROM slawatch.alert").fetchall()}
    deliveries = {
        (r[0], r[1])
        for r in conn.execute("SELECT alert_id, status FROM slawatch.delivery").fetchall()
    }
    return alert_ids, deliveries


@pytest.fixture
def outbox(conn: Conn) -> Conn:
    """The test's database with slawatch's schema."""
    migrate(conn, [])
    return conn


@pytest.fixture
def db(dsn: str, outbox: Conn) -> Iterator[Database]:
    with Database(dsn, size=2) as database:
        yield database


def test_old_sent_and_dead_history_goes_while_pending_and_recent_history_stays(
    outbox: Conn, db: Database
) -> None:
    old = NOW - RETENTION - timedelta(seconds=1)
    sent = history(outbox, old, "sent", "sent")
    dead = history(outbox, old - 300 * DAY, "dead")
    mixed = history(outbox, old, "sent", "pending")  # one receiver still to go
    waiting = history(outbox, old - DAY, "pending")
    retrying = history(outbox, old, "dead", "pending")
    recent = history(outbox, NOW - RETENTION + timedelta(seconds=1), "sent", "dead")
    bare = history(outbox, old)  # no delivery at all: nothing left to send

    result = prune(db, FixedClock(NOW), RETENTION)

    alert_ids, deliveries = kept(outbox)
    assert alert_ids == {mixed, waiting, retrying, recent}
    # An alert with a pending delivery keeps all of its deliveries: its history stays whole.
    assert deliveries == {
        (mixed, "sent"),
        (mixed, "pending"),
        (waiting, "pending"),
        (retrying, "dead"),
        (retrying, "pending"),
        (recent, "sent"),
        (recent, "dead"),
    }
    assert (result.alerts, result.deliveries) == (3, 3)
    assert sent not in alert_ids and dead not in alert_ids and bare not in alert_ids


def ack(conn: Conn, alert: int, acked_at: datetime) -> None:
    """An ack of ``alert``'s episode, made at ``acked_at``."""
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, %s, 'ana' FROM slawatch.alert WHERE id = %s",
        (acked_at, alert),
    )


def orphan(conn: Conn, alert: int, acked_at: datetime) -> None:
    """An ack naming an alert that is gone (retention before it covered acks removed
    the alert and left the ack)."""
    conn.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " VALUES ('late', %s, 1, %s, %s, 'ana')",
        (f"gone{alert}", alert, acked_at),
    )


def silence(conn: Conn, rule: str, ends_at: datetime, starts_at: datetime | None = None) -> int:
    row = conn.execute(
        "INSERT INTO slawatch.silence (rule, starts_at, ends_at, created_at, author)"
        " VALUES (%s, %s, %s, %s, 'ana') RETURNING id",
        (rule, starts_at or ends_at - DAY, ends_at, starts_at or ends_at - DAY),
    ).fetchone()
    assert row is not None
    return int(row[0])


def acked(conn: Conn) -> set[int]:
    """The alert ids the acks name."""
    return {r[0] for r in conn.execute("SELECT alert_id FROM slawatch.ack").fetchall()}


def dangling(conn: Conn) -> set[int]:
    """The alert ids that acks name but that are gone."""
    rows = conn.execute(
        "SELECT k.alert_id FROM slawatch.ack k"
        " WHERE NOT EXISTS (SELECT 1 FROM slawatch.alert a WHERE a.id = k.alert_id)"
    ).fetchall()
    return {r[0] for r in rows}


def test_an_ack_goes_with_its_alert_and_never_outlives_it(outbox: Conn, db: Database) -> None:
    old, recent = NOW - RETENTION - DAY, NOW - DAY
    both_old = history(outbox, old, "sent")
    ack(outbox, both_old, old + timedelta(hours=1))
    acked_late = history(outbox, old, "sent")  # its episode acked a day ago
    ack(outbox, acked_late, recent)
    waiting = history(outbox, old, "sent", "pending")  # kept for its pending delivery
    ack(outbox, waiting, old)
    history(outbox, old, "dead")  # never acked
    fresh = history(outbox, recent, "sent")
    ack(outbox, fresh, recent)
    orphan(outbox, 10**9, old)  # left by an earlier release's retention
    orphan(outbox, 10**9 + 1, recent)

    result = prune(db, FixedClock(NOW), RETENTION)

    alert_ids, _ = kept(outbox)
    assert alert_ids == {acked_late, waiting, fresh}
    # The late ack keeps its alert (the claim may still need it at the episode's next
    # re-notification); the kept alert keeps its ack.
    assert acked(outbox) == {acked_late, waiting, fresh, 10**9 + 1}
    assert (result.alerts, result.acks, result.orphans) == (2, 2, 1)
    # No ack names a removed alert, but the one left from before that is younger than
    # the window (it goes when it is older).
    assert dangling(outbox) == {10**9 + 1}

    # A window later (the application clock), everything above is old and sent.
    outbox.execute("UPDATE slawatch.delivery SET status = 'sent'")
    later = prune(db, FixedClock(NOW + RETENTION), RETENTION)
    assert kept(outbox) == (set(), set())
    assert acked(outbox) == set()
    assert (later.alerts, later.acks, later.orphans) == (3, 4, 1)


def test_a_silence_goes_a_window_after_it_ended(outbox: Conn, db: Database) -> None:
    cutoff = NOW - RETENTION
    active = silence(outbox, "late", NOW + DAY, starts_at=NOW - 300 * DAY)
    future = silence(outbox, "late", NOW + 40 * DAY, starts_at=NOW + DAY)
    ended_lately = silence(outbox, "late", NOW - DAY)  # `silence --list --all` shows it
    at_cutoff = silence(outbox, "other", cutoff)
    silence(outbox, "other", cutoff - timedelta(seconds=1))
    silence(outbox, "late", NOW - 300 * DAY)

    result = prune(db, FixedClock(NOW), RETENTION)

    left = {r[0] for r in outbox.execute("SELECT id FROM slawatch.silence").fetchall()}
    assert left == {active, future, ended_lately, at_cutoff}
    assert (result.silences, result.alerts, result.acks) == (2, 0, 0)


def test_acks_and_silences_go_in_the_same_bounded_batches(outbox: Conn, db: Database) -> None:
    old = NOW - RETENTION - DAY
    for i in range(3):
        ack(outbox, history(outbox, old + timedelta(minutes=i), "sent"), old)
    for i in range(5):
        orphan(outbox, 10**9 + i, old - timedelta(minutes=i))
        silence(outbox, ("late", "other")[i % 2], old - timedelta(minutes=i))

    result = prune(db, FixedClock(NOW), RETENTION, batch=2)

    # Each statement removes at most 2 of each: 2 + 1 alerts (with their acks),
    # 2 + 2 + 1 orphaned acks and ended silences; three statements.
    assert (result.alerts, result.acks, result.orphans, result.silences) == (3, 3 + 5, 5, 5)
    assert result.batches == 3
    assert acked(outbox) == set()
    assert outbox.execute("SELECT count(*) FROM slawatch.silence").fetchone() == (0,)


def test_batches_are_bounded_and_unremovable_old_alerts_do_not_stall_them(
    outbox: Conn, db: Database
) -> None:
    old = NOW - RETENTION - DAY
    # The oldest alerts still wait for a receiver: they come first in fired_at
    # order, and a batch that picked them would remove nothing and end the run.
    for i in range(3):
        history(outbox, old - timedelta(hours=i + 1), "pending")
    for i in range(7):
        history(outbox, old + timedelta(minutes=i), "sent")

    result = prune(db, FixedClock(NOW), RETENTION, batch=2)

    assert (result.alerts, result.deliveries) == (7, 7)
    assert result.batches == 4  # 2 + 2 + 2 + 1: one bounded statement each
    alert_ids, deliveries = kept(outbox)
    assert len(alert_ids) == 3 and {s for _, s in deliveries} == {"pending"}

    # The time budget ends a run after the batch in hand; the next run goes on.
    for i in range(5):
        history(outbox, old + timedelta(minutes=i), "dead")
    first = prune(db, FixedClock(NOW), RETENTION, batch=2, budget=timedelta(0))
    assert (first.alerts, first.batches) == (2, 1)
    assert prune(db, FixedClock(NOW), RETENTION, batch=2).alerts == 3


def test_a_delivery_replayed_while_a_batch_runs_is_kept_with_its_alert(
    outbox: Conn, dsn: str, db: Database
) -> None:
    """The batch read the delivery as dead; `slawatch replay` made it pending before
    the batch could delete it. The DELETE re-checks the status, and the alert stays."""
    old = NOW - RETENTION - DAY
    replayed = history(outbox, old, "sent", "dead")
    other = history(outbox, old, "sent")
    done: list[tuple[int, int]] = []
    with psycopg.connect(dsn) as replay:  # a transaction, like cmd_replay's
        replay.execute(
            "UPDATE slawatch.delivery SET status = 'pending', attempts = 0"
            " WHERE alert_id = %s AND status = 'dead'",
            (replayed,),
        )

        def batch() -> None:
            with db.connection("test prune") as conn:
                row = conn.execute(
                    queries()["prune_history"], {"cutoff": NOW - RETENTION, "batch": 10, **ALL}
                ).fetchone()
                assert row is not None
                done.append((row[0], row[1]))

        pruning = threading.Thread(target=batch, daemon=True)
        pruning.start()
        # The batch's snapshot saw the delivery dead; it now waits for the replay's row lock.
        wait_for(lambda: waiting_on_a_lock(outbox), "the batch to wait for the replay")
        replay.commit()
    pruning.join(30)
    assert not pruning.is_alive()

    alert_ids, deliveries = kept(outbox)
    assert alert_ids == {replayed}
    assert (replayed, "pending") in deliveries
    assert other not in alert_ids
    assert done == [(1, 2)]  # `other` with its delivery, and `replayed`'s sent one


def waiting_on_a_lock(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND query LIKE '%%gone_deliveries%%'"
    ).fetchone()
    return bool(row and row[0])


def test_a_batch_reads_the_old_rows_through_indexes_never_a_whole_table(outbox: Conn) -> None:
    old, recent = 120, 20_000
    # Three rules' recent history (what a table in a steady state mostly holds), one
    # rule's old history, and an old alert whose delivery is still pending.
    outbox.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " SELECT 'rule' || mod(g, 3), g::text, 1, 1, 'warning', %s - g * interval '1 second',"
        " '{}' FROM generate_series(1, %s) g",
        (NOW, recent),
    )
    outbox.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " SELECT 'rule1', 'old' || g, 1, 1, 'warning', %s - g * interval '1 hour', '{}'"
        " FROM generate_series(1, %s) g",
        (NOW - RETENTION, old),
    )
    outbox.execute(
        "INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)"
        " SELECT id, 'hook', CASE WHEN key = 'old1' THEN 'pending' ELSE 'sent' END, fired_at"
        " FROM slawatch.alert"
    )
    # Every alert's episode acked (the recent ones recently, the old ones long ago), a
    # few acks of alerts gone already; silences: recent ones of three rules, a few old.
    outbox.execute(
        "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
        " SELECT rule, key, episode, id, fired_at, 'ana' FROM slawatch.alert"
    )
    for i in range(10):
        orphan(outbox, 10**9 + i, NOW - RETENTION - DAY)
    outbox.execute(
        "INSERT INTO slawatch.silence (rule, starts_at, ends_at, created_at, author)"
        " SELECT 'rule' || mod(g, 3), %(now)s - g * interval '1 minute',"
        " %(now)s + g * interval '1 minute', %(now)s, 'ana' FROM generate_series(1, %(n)s) g",
        {"now": NOW, "n": recent // 4},
    )
    for i in range(20):
        silence(outbox, f"rule{i % 3}", NOW - RETENTION - (i + 1) * DAY)
    for table in ("alert", "delivery", "ack", "silence"):
        outbox.execute(f"ANALYZE slawatch.{table}")
    with outbox.transaction(force_rollback=True):
        (explained,) = outbox.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + queries()["prune_history"],
            {"cutoff": NOW - RETENTION, "batch": 1000, **ALL},
        ).fetchone()  # type: ignore[misc]
    with outbox.transaction(force_rollback=True):
        result = outbox.execute(
            queries()["prune_history"], {"cutoff": NOW - RETENTION, "batch": 1000, **ALL}
        ).fetchone()
    tree = nodes(explained[0]["Plan"])
    # The outbox is partitioned (0015_rotate.sql): a partition and its indexes are
    # named by their parents here.
    parent = dict(
        outbox.execute(
            "SELECT c.relname, p.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent"
            " WHERE p.relnamespace = 'slawatch'::regnamespace"
        ).fetchall()
    )
    for n in tree:
        for field in ("Relation Name", "Index Name"):
            if n.get(field) in parent:
                n[field] = parent[n[field]]
    scans = [n for n in tree if n.get("Relation Name") in ("alert", "delivery", "ack", "silence")]
    assert not [n for n in scans if "Seq Scan" in n["Node Type"]], scans
    assert {n.get("Index Name") for n in scans} >= {
        "alert_rule_fired",
        "delivery_once",
        "ack_pkey",
        "ack_acked_at",
        "silence_rule_ends",
    }

    # The old alerts come from index ranges on (rule, fired_at): every scan that
    # compares fired_at also fixes the rule, and drops at most the old pending alert.
    ranges = [n for n in tree if "fired_at" in n.get("Index Cond", "")]
    assert ranges, scans
    for n in ranges:
        assert "rule = " in n["Index Cond"], n["Index Cond"]
        assert n["Index Name"] == "alert_rule_fired"
        assert n.get("Rows Removed by Filter", 0) <= 1

    def read(relation: str) -> float:
        return sum(
            n["Actual Rows"] * n["Actual Loops"]
            for n in scans
            if n["Relation Name"] == relation and n["Node Type"] != "ModifyTable"
        )

    # Old alerts (the pending one included), one probe per rule of the skip scan, then
    # each removed alert by id, and each old ack's alert by id (is it gone?); about two
    # delivery lookups per old alert. Never 20,000.
    assert read("alert") <= old + 2 * 4 + old + (old + 10)
    assert read("delivery") <= 3 * old
    # Each old alert's ack (is it younger than the window?), the old acks by acked_at,
    # then the acks removed; the ended silences and a probe per rule. Never 20,000 or 5,000.
    assert read("ack") <= 3 * (old + 10)
    assert read("silence") <= 2 * 20 + 2 * 4
    assert result == (old - 1, old - 1, old - 1, 10, 20)


def test_a_long_run_keeps_the_outbox_the_size_of_the_retention_window(
    outbox: Conn, dsn: str, db: Database
) -> None:
    """Ten cycles of a real claim, deliveries sent, pruning and a vacuum (autovacuum's
    part): the outbox's live rows and tables stop growing once the window is full,
    so a late claim inserts into tables no larger than an early one.

    The indexes are not measured: VACUUM frees their emptied pages at once, but they
    are reused only when no transaction of *any* database is older than the freeing
    (a benchmark on a shared server defers that); the tables depend on this database.
    """
    rule = late_rule()
    orders(outbox)
    plan = prepare(outbox, rule)
    per_cycle, window = 2000, timedelta(hours=2)
    sizes: list[int] = []
    for cycle in range(10):
        now = NOW + cycle * timedelta(hours=1)
        first = cycle * per_cycle + 1
        outbox.execute(
            "INSERT INTO orders SELECT g, 'paid', %s - interval '1 day'"
            " FROM generate_series(%s::int, %s::int) g",
            (now, first, first + per_cycle - 1),
        )
        assert claim_all(outbox, plan, now) == per_cycle
        outbox.execute("UPDATE slawatch.delivery SET status = 'sent' WHERE status = 'pending'")
        prune(db, FixedClock(now), window)
        outbox.execute("VACUUM slawatch.alert, slawatch.delivery")
        row = outbox.execute(
            "SELECT (SELECT count(*) FROM slawatch.alert), pg_relation_size('slawatch.alert')"
            " + pg_relation_size('slawatch.delivery')"
        ).fetchone()
        assert row is not None
        # Fired at now, now-1h and now-2h: the cycle 2 hours back is exactly at the cutoff.
        assert row[0] <= 3 * per_cycle
        sizes.append(int(row[1]))
    # Full after the 4th claim (4 cycles' alerts before its prune); from then the
    # freed space is reused (without pruning: 2.5 times that by the 10th).
    assert max(sizes[4:]) <= 1.1 * max(sizes[:4]), sizes


# ---------------------------------------------------------------- the job in `slawatch run`


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 45) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def logged(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.INFO) -> int:
    return sum(1 for r in caplog.records if r.levelno >= level and text in r.getMessage())


def alerts_left(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM slawatch.alert").fetchone()
    except psycopg.OperationalError:
        return -1
    return int(row[0]) if row else -1


def serving(runner: Runner) -> threading.Thread:
    thread = threading.Thread(target=runner.serve, name="serve", daemon=True)
    thread.start()
    return thread


def complaints(
    caplog: pytest.LogCaptureFixture, logger: str, level: int, *allowed: str
) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(logger)
        and r.levelno >= level
        and not any(a in r.getMessage() for a in allowed)
    ]


def test_the_job_prunes_under_the_scheduler_and_a_failing_run_is_one_line_each_way(
    outbox: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="slawatch")
    old = datetime.now(UTC) - RETENTION - DAY
    for _ in range(3):
        history(outbox, old, "sent")
    impatient = make_conninfo(dsn, options="-c lock_timeout=200")
    # No rules, no notifiers: the pruning job is the only user of the database.
    runner = Runner(impatient, [], [], maintain_every=timedelta(seconds=0.2))
    with psycopg.connect(dsn) as blocker:
        blocker.execute("LOCK TABLE slawatch.delivery IN ACCESS EXCLUSIVE MODE")
        thread = serving(runner)
        try:
            # Several runs fail (the later ones are DEBUG lines only).
            wait_for(
                lambda: logged(caplog, "pruning history failing", logging.DEBUG) >= 3,
                "three failed runs",
            )
            blocker.rollback()
            wait_for(lambda: alerts_left(dsn) == 0, "the old history to go")
            wait_for(lambda: logged(caplog, "pruning history working again") > 0, "recovery")
        finally:
            runner.stop()
            thread.join(60)
            runner.close()
    assert not thread.is_alive()
    (failing,) = [
        r
        for r in caplog.records
        if "pruning history failing" in r.getMessage() and r.levelno >= logging.INFO
    ]
    assert failing.levelno == logging.ERROR and "lock timeout" in failing.getMessage()
    assert failing.exc_info is None  # an expected failure: a line, no traceback
    pruned = "pruned 3 alerts, 3 deliveries, 0 acks and 0 silences older than 4w2d"
    assert logged(caplog, pruned) == 1
    # Our handling, not APScheduler's: it never saw a job raise. (Its warnings that a
    # run was skipped while the previous one waited are expected at this pace.)
    assert complaints(caplog, "apscheduler", logging.ERROR) == []


def test_an_unexpected_error_in_the_job_is_logged_once_with_its_traceback(
    outbox: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(2):
        history(outbox, datetime.now(UTC) - RETENTION - DAY, "sent")
    # No rules: only the pruning job reads the clock, which raises twice (any bug).
    runner = Runner(dsn, [], [], clock=FaultyClock(2), maintain_every=timedelta(seconds=0.2))
    thread = serving(runner)
    try:
        wait_for(lambda: alerts_left(dsn) == 0, "the run after two failed ones to prune")
        wait_for(lambda: logged(caplog, "pruning history working again") > 0, "recovery")
    finally:
        runner.stop()
        thread.join(60)
        runner.close()
    (failing,) = [r for r in caplog.records if "pruning history failing" in r.getMessage()]
    assert "unexpected RuntimeError: clock broke" in failing.getMessage()
    assert failing.exc_info is not None
    assert complaints(caplog, "apscheduler", logging.ERROR) == []


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as c:
        yield c


def test_the_job_outlives_a_database_outage(
    cluster: PgCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="slawatch")
    dsn = cluster.database(f"retention_{uuid.uuid4().hex[:8]}")
    old = datetime.now(UTC) - RETENTION - DAY

    def add_old(count: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(count):
                history(conn, old, "dead")

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, [])
    add_old(2)
    runner = Runner(dsn, [], [], timeout=1.0, maintain_every=timedelta(seconds=0.3))
    thread = serving(runner)
    try:
        wait_for(lambda: alerts_left(dsn) == 0, "the first old history to go")
        cluster.stop()
        wait_for(lambda: logged(caplog, "database unreachable") > 0, "the outage line")
        # Down for several runs of the job, each waiting out the pool timeout (the
        # later failures are DEBUG lines of the same outage).
        wait_for(
            lambda: logged(caplog, "unreachable: pruning alert history", logging.DEBUG) >= 3,
            "three runs of the job to fail",
        )
        cluster.start()
        add_old(4)
        wait_for(lambda: alerts_left(dsn) == 0, "the old history after the outage to go")
        wait_for(lambda: logged(caplog, "database reachable again") > 0, "the end-of-outage line")
    finally:
        runner.stop()
        thread.join(60)
        runner.close()
    assert not thread.is_alive()
    assert logged(caplog, "database unreachable") == 1
    assert logged(caplog, "database reachable again after") == 1
    assert complaints(caplog, "slawatch", logging.WARNING, "database unreachable") == []
    # Our handling, not APScheduler's: it never saw a job raise. (Its warnings that a
    # run was skipped while the previous one waited are expected at this pace.)
    assert complaints(caplog, "apscheduler", logging.ERROR) == []


def test_the_index_retention_reads_acks_by_is_part_of_the_schema(outbox: Conn) -> None:
    """An outbox from before retention covered acks (the previous release's, at 0001)
    lacks ack_acked_at: `run` asks for a migrate, which builds it (0002_trust.sql)."""
    unrotated(outbox)  # 0015_rotate.sql
    outbox.execute("DROP INDEX slawatch.ack_acked_at")
    outbox.execute("DELETE FROM slawatch.schema_version WHERE version > 1")
    outbox.execute("DROP INDEX slawatch.delivery_orphaned; DROP TABLE slawatch.session")
    outbox.execute("DROP TABLE slawatch.event_seen")  # 0003_events.sql
    outbox.execute("DROP TABLE slawatch.action")  # 0004_actions.sql
    outbox.execute(  # 0005_action_webhook.sql
        "DROP TRIGGER action_settled ON slawatch.delivery;"
        " DROP FUNCTION slawatch.action_delivery_settled()"
    )
    outbox.execute("DROP TABLE slawatch.episode")  # 0006_episode_history.sql
    outbox.execute("DROP TABLE slawatch.event_held")  # 0010_held_events.sql
    outbox.execute("DROP TABLE slawatch.scanner")  # 0013_scan_heartbeat.sql
    outbox.execute("ALTER TABLE slawatch.delivery RESET (fillfactor)")  # 0014_delivery_lease.sql
    outbox.execute(  # 0012_generation.sql
        "DROP TABLE slawatch.rule_generation; DROP FUNCTION slawatch.claim_gate(text, text),"
        " slawatch.record_generation(text, text, jsonb)"
    )
    assert not schema_current(outbox)
    migrate(outbox, [])
    assert schema_current(outbox)
    assert outbox.execute("SELECT to_regclass('slawatch.ack_acked_at')").fetchone() != (None,)


def test_episodes_ended_before_the_window_go_in_batches_and_open_ones_stay(
    outbox: Conn, db: Database
) -> None:
    """The episode history (0006_episode_history.sql): an ended episode goes a window
    after it ended; an open one stays however old it is."""
    cutoff = NOW - RETENTION

    def episode(key: str, notified: datetime, ended: datetime | None) -> None:
        outbox.execute(
            "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at,"
            " ended_at) VALUES ('late', %s, 1, %s, %s, %s, %s)",
            (key, notified, notified, notified, ended),
        )

    for i in range(3):
        episode(f"old{i}", cutoff - 9 * DAY, cutoff - timedelta(seconds=i + 1))
    episode("at_cutoff", cutoff - 9 * DAY, cutoff)
    episode("open", cutoff - 300 * DAY, None)
    episode("recent", NOW - DAY, NOW)

    result = prune(db, FixedClock(NOW), RETENTION, batch=2)

    left = {r[0] for r in outbox.execute("SELECT key FROM slawatch.episode").fetchall()}
    assert left == {"at_cutoff", "open", "recent"}
    assert (result.episodes, result.batches) == (3, 2)
