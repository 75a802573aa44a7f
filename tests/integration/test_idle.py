"""An idle scan costs one cheap statement: the probe ("anything due?") on the partial
indexes, before the claim, which runs only when the probe finds something (issue 18).
A ``track: table`` rule's too, between sweeps, and its watermark is written only
when it matters (statetable.Mark)."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
from psycopg import sql

from slawatch.clock import Clock
from slawatch.db import PREPARED_MAX, Database, Pooler
from slawatch.engine.claim import ClaimPlan, DrainResult, anything_due, drain
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.errors import SlawatchError
from slawatch.operate.inspect import rule_status
from slawatch.runtime import scans
from slawatch.runtime import scheduler as scheduler_module
from slawatch.runtime.definitions import Definitions
from slawatch.runtime.scans import ScanRecords
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn, alerts_of, episodes, shop
from tests.integration.test_events import T0, M, parcel, send, timer
from tests.integration.test_round_trips import round_trips
from tests.waiting import lock_waits, wait_until

NOW = datetime(2026, 3, 1, tzinfo=UTC)
T = TypeVar("T")


class Fixed(Clock):
    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


@pytest.fixture
def pooled(dsn: str) -> Database:
    """A pool of one connection that prepares nothing, so the trace shows each statement
    and round trip as text (a statement's first prepared run costs one more round trip;
    with preparation: test_the_probe_is_prepared_where_the_pooler_allows_and_stays_so)."""
    db = Database(dsn, size=1, timeout=10, pooler="transaction")
    yield db  # type: ignore[misc]
    db.close()


def traced_drain(db: Database, plan: ClaimPlan, at: datetime) -> tuple[int, int]:
    """(round trips, alerts) of one drain at ``at`` on the pool's one connection."""
    with db.connection("tracing") as conn:
        traced = conn
    out: list[int] = []
    trips = round_trips(traced, lambda: out.append(drain(db, plan, Fixed(at)).claimed))
    return trips, out[0]


def sent_statements(db: Database, work: Callable[[], object]) -> list[str]:
    """The first line of each statement ``work()`` sent on the pool's one connection."""
    with db.connection("tracing") as conn:
        traced = conn
    with tempfile.TemporaryFile("w+") as trace:
        traced.pgconn.trace(trace.fileno())
        try:
            work()
        finally:
            traced.pgconn.untrace()
        trace.seek(0)
        sent = [line.split("\t") for line in trace.read().splitlines()]
    return [f[-1] for f in sent if len(f) > 3 and f[1] == "F" and f[3] in ("Parse", "Query")]


def paid(conn: Conn, order: int, at: datetime) -> None:
    conn.execute(
        "INSERT INTO orders (id, user_id, total_cents, status, paid_at)"
        " VALUES (%s, 7, 100, 'paid', %s)",
        (order, at),
    )


def test_an_idle_inline_drain_is_one_read_only_statement(conn: Conn, pooled: Database) -> None:
    plan = prepare(conn, shop(conn)["order_unshipped"])
    paid(conn, 1, NOW - timedelta(hours=1))  # due in 47 hours
    assert traced_drain(pooled, plan, NOW) == (1, 0)
    sent = sent_statements(pooled, lambda: drain(pooled, plan, Fixed(NOW)))
    # No write: the rule's probe function (its probe; engine/probefn.py).
    assert len(sent) == 2 and "set_config('lock_timeout'" in sent[0]  # in one request
    assert '"SELECT "slawatch"."order_unshipped_probe"(' in sent[1]


def test_the_probe_finds_each_kind_of_work(conn: Conn, pooled: Database) -> None:
    """A first notice, a re-notification and an episode that ended each make the probe
    say yes, so the claim runs (and closes or notifies); then it is idle again."""
    plan = prepare(conn, shop(conn)["order_unshipped"])
    paid(conn, 1, NOW - timedelta(days=3))  # due: a first notice
    assert traced_drain(pooled, plan, NOW) == (2, 1)  # probe + claim
    assert traced_drain(pooled, plan, NOW) == (1, 0)  # notified: idle until its re-notice
    renotify = plan.rule.renotify
    assert renotify is not None and renotify.every is not None
    later = NOW + renotify.every + timedelta(seconds=1)
    assert traced_drain(pooled, plan, later) == (2, 1)  # the re-notification
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    trips, alerts = traced_drain(pooled, plan, later)
    assert (trips, alerts) == (2, 0)  # the episode ended: the claim closes it
    closed = conn.execute("SELECT sw_order_unshipped_seen FROM orders WHERE id = 1").fetchone()
    assert closed == (None,)
    assert traced_drain(pooled, plan, later) == (1, 0)


def test_an_idle_scan_is_recorded_when_its_outcome_changes_or_its_record_is_old(
    conn: Conn, pooled: Database
) -> None:
    shop(conn)
    records = ScanRecords()

    def scan(at: datetime, claimed: int = 0, error: str | None = None) -> None:
        def drained(rule: str) -> DrainResult:
            if error is not None:
                raise SlawatchError(error)
            return DrainResult(claimed, 1)

        with contextlib.suppress(SlawatchError):
            scans.recorded(pooled, "late", Fixed(at), drained, records)

    def last() -> tuple[object, ...] | None:
        return conn.execute("SELECT last_at, claimed, error FROM slawatch.scan").fetchone()

    scan(NOW)
    assert last() == (NOW, 0, None)  # the first scan is written
    scan(NOW + timedelta(seconds=1))
    assert last() == (NOW, 0, None)  # the same outcome: not written again
    scan(NOW + timedelta(seconds=2), claimed=3)
    assert last() == (NOW + timedelta(seconds=2), 3, None)
    scan(NOW + timedelta(seconds=3))
    assert last() == (NOW + timedelta(seconds=3), 0, None)  # back to nothing: a change
    scan(NOW + timedelta(seconds=4), error="boom")
    assert last() == (NOW + timedelta(seconds=4), 0, "boom")
    scan(NOW + timedelta(seconds=5), error="boom")
    assert last() == (NOW + timedelta(seconds=4), 0, "boom")
    scan(NOW + timedelta(seconds=6))
    assert last() == (NOW + timedelta(seconds=6), 0, None)  # recovered: at once
    records.refresh = 0.0  # the record is old: written however alike
    scan(NOW + timedelta(seconds=7))
    assert last() == (NOW + timedelta(seconds=7), 0, None)


def test_the_last_scan_shown_is_the_last_scan_run_idle_or_not(conn: Conn, pooled: Database) -> None:
    """Idle scans write nothing to slawatch.scan (but once a minute); each process's
    beat (one row) says when it last scanned each rule, and status shows the later."""
    rules = shop(conn)
    rule = rules["order_unshipped"]
    records, other = ScanRecords(), ScanRecords()  # two processes

    def scan(by: ScanRecords, at: datetime) -> None:
        scans.recorded(pooled, rule.name, Fixed(at), lambda _: DrainResult(0, 1), by)

    def shown() -> tuple[object, ...]:
        (status,) = rule_status(conn, [rule], NOW)
        assert status.last_scan is not None
        return status.last_scan.at, status.last_scan.claimed

    def beats() -> list[tuple[object, ...]]:
        return conn.execute("SELECT instance, at FROM slawatch.scanner ORDER BY at").fetchall()

    scan(records, NOW)
    for seconds in (5, 10, 15):
        scan(records, NOW + timedelta(seconds=seconds))
    assert shown() == (NOW, 0)  # written once: the idle scans after it were not
    records.beat(pooled, NOW + timedelta(seconds=16))
    assert shown() == (NOW + timedelta(seconds=15), 0)
    records.beat(pooled, NOW + timedelta(seconds=17))  # nothing scanned since: no write
    assert beats() == [(records.instance, NOW + timedelta(seconds=16))]
    scan(other, NOW + timedelta(seconds=20))  # another process, a scan later
    other.beat(pooled, NOW + timedelta(seconds=21))
    assert shown() == (NOW + timedelta(seconds=20), 0)
    # A process gone for a day leaves no row behind.
    scan(other, NOW + timedelta(days=1, seconds=30))
    other.beat(pooled, NOW + timedelta(days=1, seconds=30))
    assert [i for i, _ in beats()] == [other.instance]


def test_a_running_process_shows_its_idle_scans(conn: Conn, dsn: str) -> None:
    """`slawatch run` beats every few seconds: the last scan shown moves on while the
    scans find nothing (its slawatch.scan row is written once a minute only)."""
    rules = shop(conn)
    rule = rules["order_unshipped"].model_copy(update={"every": timedelta(seconds=1)})
    migrate(conn, [rule])
    runner = Runner(dsn, [rule], [])
    serving = threading.Thread(target=runner.serve, kwargs={"seconds": 60}, daemon=True)

    def written() -> object:
        row = conn.execute("SELECT last_at FROM slawatch.scan").fetchone()
        return None if row is None else row[0]

    def moved_on() -> bool:
        (status,) = rule_status(conn, [rule], NOW)
        first = written()
        return first is not None and status.last_scan is not None and status.last_scan.at > first

    try:
        serving.start()
        wait_until(moved_on, "a last scan later than the one written to slawatch.scan")
    finally:
        runner.stop()
        serving.join(timeout=30)
        runner.close()


def test_the_scans_of_many_rules_share_a_bounded_pool(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12 rules scanned every second, in two steps of 6: at most
    SLAWATCH_SCAN_CONNECTIONS + 2 connections (no notifier, no source: one for the rest,
    one for the delivery listener), not one per rule, and as many scan threads as
    SLAWATCH_SCAN_CONNECTIONS: the scans never wait in the pool, nor take the rest's
    connection; every rule is scanned all the same."""
    monkeypatch.setattr(scheduler_module, "STEP_RULES", 6)
    base = shop(conn)["order_unshipped"]
    rules = [
        base.model_copy(update={"name": f"late{i:02}", "every": timedelta(seconds=1)})
        for i in range(12)
    ]
    migrate(conn, rules)
    paid(conn, 1, NOW - timedelta(days=3))
    runner = Runner(dsn, rules, [], scan_connections=2)
    seen: list[int] = []

    def connections() -> int:
        row = conn.execute(
            # client backends only: an autovacuum worker of this database is listed too
            # (CI once saw 4 of 3 here)
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        assert row is not None
        seen.append(int(row[0]))
        return seen[-1]

    def scanned() -> bool:
        connections()
        row = conn.execute("SELECT count(*) FROM slawatch.scan").fetchone()
        alerted = {rule for (rule,) in alerts_of(conn, None, "rule")}
        return row == (12,) and len(alerted) == 12

    serving = threading.Thread(target=runner.serve, kwargs={"seconds": 60}, daemon=True)
    try:
        # Every scan held up (the table locked): each step's turn comes while the other
        # waits in the executor's queue, on its threads: one per scan connection.
        with conn.transaction():
            conn.execute("LOCK TABLE orders")
            # Each rule's first scan is within a second of the start: a job whose next
            # run is 2 s after it was handed to the executor at least once.
            after = datetime.now(UTC) + timedelta(seconds=2)
            serving.start()
            wait_until(
                lambda: len(lock_waits(conn)) == 2 and every_scan_submitted(runner, 12, after),
                "both scan connections waiting, every step's scan submitted",
            )
            scanning = [t.name for t in threading.enumerate() if t.name.startswith("scans")]
        wait_until(scanned, "a scan and an alert of every rule")
    finally:
        runner.stop()
        serving.join(timeout=30)
        runner.close()
    assert max(seen) <= 2 + 2
    assert sorted(scanning) == ["scans_0", "scans_1"]


def every_scan_submitted(runner: Runner, rules: int, after: datetime) -> bool:
    """Whether the scan jobs of ``rules`` rules (their steps') all have their next run
    later than ``after``."""
    scheduler = runner._scheduler
    if scheduler is None or not scheduler.running:
        return False
    jobs = [j for j in scheduler.get_jobs() if j.id.startswith("scan:")]
    return sum(len(j.args[0].names) for j in jobs) == rules and all(
        j.next_run_time is not None and j.next_run_time > after for j in jobs
    )


def test_a_pooled_connection_keeps_as_many_prepared_statements_as_the_runner_asks(
    dsn: str,
) -> None:
    """Each rule's probe is prepared on every connection the scans use: a cache smaller
    than the rules' statements (psycopg's is an LRU) evicts each just before its next
    run. The runner's size reaches connections made before it was raised (a reload)."""
    db = Database(dsn, size=1, timeout=10)
    try:
        with db.connection("looking") as conn:
            made = conn
            assert conn.prepared_max == PREPARED_MAX
        db.prepared_max = PREPARED_MAX + 2 * 1_500
        with db.connection("looking again") as conn:
            assert conn is made and conn.prepared_max == PREPARED_MAX + 3_000
    finally:
        db.close()


def test_one_scan_reads_old_definitions_again_while_the_others_go_by_them(
    conn: Conn, dsn: str
) -> None:
    """With a thousand rules, 200 scans a second find the recorded definitions old at
    once: one reads them again, the others go by the records they have (each reading
    every rule's row made the cost grow with the square of the rules). Records never
    read, or set aside by a refusal, are read before a check answers."""
    rule = shop(conn)["order_unshipped"]
    migrate(conn, [rule])
    reading, go_on = threading.Event(), threading.Event()
    reads: list[str] = []

    class Slow(Database):
        def run(self, what: str, work: Callable[[Conn], T]) -> T:
            if "recorded definitions" in what:
                reads.append(what)
                if len(reads) == 2:  # the second read waits, holding the reader's lock
                    reading.set()
                    assert go_on.wait(30)
            return super().run(what, work)

    db = Slow(dsn, size=2, timeout=10)
    definitions = Definitions(db, reread=0.0)  # records are old as soon as read
    try:
        assert definitions.check(rule) and len(reads) == 1  # never read: read first
        reader = threading.Thread(target=definitions.check, args=(rule,))
        reader.start()
        assert reading.wait(30)
        answered: list[bool] = []

        def check() -> None:
            answered.append(definitions.check(rule))

        other = threading.Thread(target=check)
        other.start()
        other.join(timeout=10)
        assert answered == [True] and len(reads) == 2  # by the old records, no read
        go_on.set()
        reader.join(timeout=30)
        definitions.invalidate()
        assert definitions.check(rule) and len(reads) == 3  # set aside: read again
    finally:
        go_on.set()
        db.close()


def test_an_event_rules_housekeeping_waits_for_the_probe_and_the_probe_sees_it(
    conn: Conn, pooled: Database
) -> None:
    """An idle event rule's scan is its probe alone; a too-fast stop whose one page was
    claimed is closed by the next scan, before any re-notification is due."""
    rule = parcel(min="5m")
    migrate(conn, [rule])
    plan = prepare(conn, rule)
    assert traced_drain(pooled, plan, T0) == (1, 0)  # no timer: the probe alone
    send(conn, "parcel_shipped", "I", T0)
    send(conn, "parcel_delivered", "I", T0 + 2 * M)  # ran too fast: pages once
    assert drain(pooled, plan, Fixed(T0 + 3 * M)).claimed == 1
    assert timer(conn, "I") == (T0 + 2 * M, True)
    assert drain(pooled, plan, Fixed(T0 + 4 * M)).claimed == 0  # re-notice due in 12 h
    assert timer(conn, "I") == (T0 + 2 * M, False)


@pytest.mark.parametrize("pooler", ["none", "auto", "transaction"])
def test_the_probe_is_prepared_where_the_pooler_allows_and_stays_so(
    conn: Conn, dsn: str, pooler: Pooler
) -> None:
    """Prepared at its first run (with the default ``auto`` too: this connection is
    direct), and kept among a hundred rules' statements: psycopg's default cache (100)
    would evict it. Where it is prepared the probe is its text, not the rule's probe
    function (engine/probefn.py): its generic plan is the function's, without the call."""
    plan = prepare(conn, shop(conn)["order_unshipped"])
    with Database(dsn, size=1, timeout=10, pooler=pooler) as db:
        drain(db, plan, Fixed(NOW))
        assert traced_drain(db, plan, NOW) == (1, 0)  # once prepared: one round trip
        with db.connection("other rules' statements") as pooled:
            for i in range(150):
                pooled.execute(f"SELECT {i} + %s::int", (i,), prepare=pooler != "transaction")
            prepared = pooled.execute(
                "SELECT statement LIKE 'SELECT (SELECT CASE WHEN %%', count(*)"
                " FROM pg_prepared_statements WHERE statement LIKE '%%order_unshipped%%'"
                " GROUP BY 1"
            ).fetchall()
    assert prepared == ([] if pooler == "transaction" else [(True, 1)])


def generic_plan(conn: Conn, probe: object, params: dict[str, str]) -> str:
    """The plan PostgreSQL keeps for ``probe`` once it stops planning it per run (the
    generic one, forced here, as it is chosen after 5 runs of a prepared statement)."""
    text = sql_as_text(conn, probe)
    for i, name in enumerate(params, 1):
        text = text.replace(f"%({name})s", f"${i}")
    conn.execute(
        f"PREPARE generic_probe({', '.join('timestamptz' for _ in params)}) AS "
        + text.replace("%%", "%")
    )
    try:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        args = ", ".join(f"'{v}'" for v in params.values())
        rows = conn.execute(f"EXPLAIN (COSTS OFF) EXECUTE generic_probe({args})").fetchall()
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE generic_probe")
    return "\n".join(str(r[0]) for r in rows)


def sql_as_text(conn: Conn, composed: object) -> str:
    assert isinstance(composed, sql.Composable)
    return composed.as_string(conn)


def test_the_probes_generic_plan_reads_the_first_index_entries_not_the_table(
    conn: Conn,
) -> None:
    """Flat in open timers whatever the plan cache does: the generic plan of an event
    rule's probe (and of a ``track: table`` rule's) reads the first entry of each partial
    index; the EXISTS form it replaced was planned as a scan of the whole table. Neither
    is planned parallel."""
    rule = parcel()
    migrate(conn, [rule])
    conn.execute(
        'INSERT INTO slawatch."parcel_timers" (key, started_at, due_at, open)'
        " SELECT 'k' || g, %s::timestamptz, %s::timestamptz + g * interval '1 s', true"
        " FROM generate_series(1, 20000) g",
        (T0, T0 + 72 * timedelta(hours=1)),
    )
    conn.execute('ANALYZE slawatch."parcel_timers"')
    # As eager for parallel plans as PostgreSQL can be: a large table's generic plan of
    # the range of due rows is parallel, its workers' start 15-30 ms for a 0.2 ms read.
    for knob in (
        "parallel_setup_cost",
        "parallel_tuple_cost",
        "min_parallel_table_scan_size",
        "min_parallel_index_scan_size",
    ):
        conn.execute(f"SET {knob} = 0")
    plan = prepare(conn, rule)
    at = str(T0)
    shown = generic_plan(conn, plan.probe, {"cutoff": at, "renotify_by": at})
    assert "Seq Scan" not in shown and shown.count("Index Only Scan") == 3, shown
    assert "Gather" not in shown, shown
    assert not anything_due(conn, plan, T0)  # and it answers: nothing due yet

    table = table_plan(conn)
    assert table.table is not None
    conn.execute(
        "INSERT INTO slawatch.order_unshipped_state (id, sw_seen, sw_ep, sw_n, sw_next)"
        " SELECT g, %s::timestamptz, 1, 1, %s::timestamptz + g * interval '1 s'"
        " FROM generate_series(1, 20000) g",
        (T0, T0 + 12 * timedelta(hours=1)),
    )
    conn.execute(
        "INSERT INTO orders (id, user_id, total_cents, status, paid_at)"
        " SELECT g, 7, 100, 'paid', %s::timestamptz - g * interval '1 s'"
        " FROM generate_series(1, 20000) g",
        (T0,),
    )
    conn.execute("ANALYZE orders")
    conn.execute("ANALYZE slawatch.order_unshipped_state")
    shown = generic_plan(conn, table.table.probe, {"since": at, "cutoff": at, "renotify_by": at})
    assert "Seq Scan on order_unshipped_state" not in shown, shown
    assert "Index Only Scan using order_unshipped_state_again" in shown, shown
    assert "Gather" not in shown, shown


# --------------------------------------------------------------------- track: table

H, S = timedelta(hours=1), timedelta(seconds=1)
DUE = 48 * H  # order_unshipped: due 48 h after paid_at; look-back 30 s (its `every`)


def table_plan(conn: Conn, sweep: timedelta = timedelta(days=1)) -> ClaimPlan:
    """order_unshipped tracked ``table``; its sweep a day apart unless said, so the
    scans in between are the probe's."""
    rule = shop(conn, "table")["order_unshipped"]
    return prepare(conn, rule.model_copy(update={"sweep": sweep}))


def watermark(conn: Conn) -> tuple[object, ...] | None:
    return conn.execute("SELECT scanned_to, swept_at FROM slawatch.watermark").fetchone()


def order(conn: Conn, order: int, at: datetime, status: str = "paid") -> None:
    conn.execute(
        "INSERT INTO orders (id, user_id, total_cents, status, paid_at)"
        " VALUES (%s, 7, 100, %s, %s)",
        (order, status, at),
    )


def test_an_idle_table_drain_is_one_read_only_statement(conn: Conn, pooled: Database) -> None:
    """Between sweeps an idle scan is the probe alone, and no scan writes the watermark
    until one claims a fresh row: rows not due, notified, not open, or due before the
    look-back (a backfill: the sweep's) make no claim run."""
    plan = table_plan(conn, sweep=timedelta(minutes=10))
    order(conn, 1, NOW - H)  # due in 47 h
    order(conn, 2, NOW - DUE - 10 * S)  # due 10 s ago: notified by the first drain
    order(conn, 3, NOW - DUE - 5 * S, status="shipped")  # due, in the look-back: not open
    assert drain(pooled, plan, Fixed(NOW)).claimed == 1  # the first: sweeps, claims 2
    mark = watermark(conn)
    assert mark == (NOW, NOW)
    order(conn, 4, NOW - 10 * DUE)  # a backfill: found by the next sweep, not by a scan
    five = NOW + 5 * timedelta(minutes=1)
    for later in (NOW + S, five, five + S):
        sent = sent_statements(pooled, lambda at=later: drain(pooled, plan, Fixed(at)))
        # No write: the probe function (engine/probefn.py) alone.
        assert len(sent) == 2 and "set_config('lock_timeout'" in sent[0]  # in one request
        assert '"SELECT "slawatch"."order_unshipped_probe"(' in sent[1]
        if later == five:  # due 4 minutes ago, committed now: before the idle probes'
            order(conn, 5, NOW - DUE + 60 * S)  # window too (it moved on): the sweep's
    assert watermark(conn) == mark
    swept = NOW + 11 * timedelta(minutes=1)  # the sweep is due: it finds the backfills
    assert drain(pooled, plan, Fixed(swept)).claimed == 2
    assert watermark(conn) == (swept, swept)
    assert [k for k, _, _ in episodes(conn, "order_unshipped")] == ["2", "4", "5"]


def test_work_found_after_idle_table_scans_is_claimed_by_the_next(
    conn: Conn, pooled: Database
) -> None:
    """A row falling due, one committed late (within the look-back), a deadline moved
    to a time already due, a re-notification: each after idle scans, each claimed by
    the next scan (probe + claim), and idle again after."""
    plan = table_plan(conn)
    assert drain(pooled, plan, Fixed(NOW)).claimed == 0  # the first: sweeps
    order(conn, 1, NOW - DUE + 30 * S)  # due at NOW + 30 s
    assert traced_drain(pooled, plan, NOW + 10 * S) == (1, 0)
    assert traced_drain(pooled, plan, NOW + 20 * S) == (1, 0)
    order(conn, 2, NOW - DUE + 15 * S)  # due at NOW + 15 s, committed after the last scan
    assert traced_drain(pooled, plan, NOW + 25 * S) == (2, 1)
    assert traced_drain(pooled, plan, NOW + 31 * S) == (2, 1)
    assert traced_drain(pooled, plan, NOW + 35 * S) == (1, 0)
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 1", (NOW - DUE + 36 * S,))
    assert traced_drain(pooled, plan, NOW + 40 * S) == (2, 1)  # episode 2 of order 1
    assert traced_drain(pooled, plan, NOW + 6 * H) == (1, 0)
    assert traced_drain(pooled, plan, NOW + 6 * H + 30 * S) == (2, 1)  # order 2's #2
    assert traced_drain(pooled, plan, NOW + 6 * H + 35 * S) == (1, 0)
    assert traced_drain(pooled, plan, NOW + 6 * H + 41 * S) == (2, 1)  # order 1's #2
    assert traced_drain(pooled, plan, NOW + 6 * H + 45 * S) == (1, 0)
    assert episodes(conn, "order_unshipped") == [
        ("1", 1, 1),
        ("1", 2, 1),
        ("1", 2, 2),
        ("2", 1, 1),
        ("2", 1, 2),
    ]


def test_the_watermark_is_written_after_a_sweep_or_a_claim_a_minute_after_the_last(
    conn: Conn, pooled: Database
) -> None:
    plan = table_plan(conn)
    assert drain(pooled, plan, Fixed(NOW)).claimed == 0
    assert watermark(conn) == (NOW, NOW)  # swept: written
    order(conn, 1, NOW - DUE + 5 * S)
    assert drain(pooled, plan, Fixed(NOW + 10 * S)).claimed == 1
    assert watermark(conn) == (NOW, NOW)  # a fresh claim, 10 s after the last write
    order(conn, 2, NOW - DUE + 90 * S)
    later = NOW + 100 * S
    assert drain(pooled, plan, Fixed(later)).claimed == 1
    assert watermark(conn) == (later, NOW)  # a fresh claim, over a minute after
    renotified = NOW + 10 * S + 6 * H + S
    assert drain(pooled, plan, Fixed(renotified)).claimed == 1
    assert watermark(conn) == (later, NOW)  # a re-notification: the window is as it was
    swept = NOW + 2 * timedelta(days=1)  # the sweep is due; nothing fresh: written
    assert drain(pooled, plan, Fixed(swept)).claimed == 2  # re-notifications
    assert watermark(conn) == (swept, swept)


def test_a_restart_after_idle_table_scans_misses_nothing(conn: Conn, pooled: Database) -> None:
    """The idle scans moved the watermark in memory only: a new process (a crash, a
    restart) reads the stored one, re-reads from there, and claims what fell due after
    the old process's last scan, without notifying again what it had claimed."""
    plan = table_plan(conn)
    assert drain(pooled, plan, Fixed(NOW)).claimed == 0  # stored: NOW
    order(conn, 1, NOW - DUE + 30 * S)
    assert drain(pooled, plan, Fixed(NOW + 40 * S)).claimed == 1  # not stored (40 s)
    for minutes in (2, 3):
        assert traced_drain(pooled, plan, NOW + minutes * timedelta(minutes=1)) == (1, 0)
    assert watermark(conn) == (NOW, NOW)
    order(conn, 2, NOW - DUE + 200 * S)  # due after the last scan (NOW + 180 s)
    order(conn, 3, NOW - DUE + 170 * S)  # due before it, committed after it
    restarted = prepare(conn, plan.rule)  # a new process: its watermark is the stored one
    assert drain(pooled, restarted, Fixed(NOW + 4 * timedelta(minutes=1))).claimed == 2
    assert [k for k, _, _ in episodes(conn, "order_unshipped")] == ["1", "2", "3"]
    assert traced_drain(pooled, restarted, NOW + 5 * timedelta(minutes=1)) == (1, 0)
