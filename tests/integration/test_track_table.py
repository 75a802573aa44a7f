"""track: table — slawatch's own state table; the watched table is only read.

The shared lifecycle tests (test_lifecycle.py, test_episodes.py) run in both ways;
these cover what is particular to this way: read-only access, the watermark and
its look-back, the sweep, and concurrent scanners without row locks.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from slawatch.config.rules import Rule
from slawatch.engine.migrate import grants, migrate
from slawatch.engine.ready import prepare
from tests.conftest import ROOT
from tests.integration.helpers import (
    DAY,
    Conn,
    alerts_of,
    batch_with_nested_loops,
    claim_all,
    episodes,
    plan_nodes,
    shop,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)

TABLE = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, user_id bigint, status text NOT NULL, paid_at timestamptz,
    note text
)"""


def rule(**fields: object) -> Rule:
    base = {
        "name": "late",
        "table": "public.orders",
        "track": "table",
        "deadline": "paid_at",
        "after": "1h",
        "open_when": "status = 'paid'",
        "renotify": {"every": "6h", "max": 3},
        "notify": ["console"],
    }
    return Rule.model_validate(base | fields)


def _due_index_reads(conn: Conn) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'sw_late_due'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_migrate_leaves_the_watched_table_alone_but_for_one_index(conn: Conn) -> None:
    conn.execute(TABLE)
    done = migrate(conn, [rule()])
    assert "public.orders: built index sw_late_due" in done
    assert "slawatch.late_state: created" in done
    columns = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders'"
    ).fetchall()
    assert not [c for (c,) in columns if c.startswith("sw_")]
    (indexdef,) = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'sw_late_due'"
    ).fetchone()  # type: ignore[misc]
    assert indexdef.endswith("(paid_at) WHERE (status = 'paid'::text)")
    assert migrate(conn, [rule()]) == []
    # Switching a rule to inline drops the table way's index, and back.
    done = migrate(conn, [rule(track="inline")])
    assert "public.orders: dropped index sw_late_due (track changed)" in done
    done = migrate(conn, [rule()])
    assert "public.orders: dropped index sw_late_first (track changed)" in done


def test_a_role_that_may_only_read_the_watched_table_runs_it(conn: Conn, dsn: str) -> None:
    """Least privilege: SELECT on the columns the rule reads, nothing else there."""
    conn.execute(TABLE)
    late = rule(columns=["id", "user_id"])
    migrate(conn, [late])
    conn.execute("INSERT INTO orders VALUES (1, 7, 'paid', %s, 'x')", (T0,))
    role = f"slawatch_ro_{uuid.uuid4().hex[:6]}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        printed = [g.as_string(conn) for g in grants([late], role, {"late": ["id"]})]
        assert 'GRANT SELECT ("id", "paid_at", "user_id", "status") ON "public"."orders"' in (
            " ".join(printed)
        )
        assert not [g for g in printed if "UPDATE (" in g]
        for g in printed:
            conn.execute(g.encode())
        params = conninfo_to_dict(dsn) | {"user": role}
        params.pop("password", None)
        with psycopg.connect(make_conninfo(**params), autocommit=True) as app:
            plan = prepare(app, late)
            assert claim_all(app, plan, T0 + 2 * H) == 1
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT note FROM orders")
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")
    assert episodes(conn, "late") == [("1", 1, 1)]


def test_a_row_that_opens_with_a_deadline_long_past_is_found_by_the_sweep(conn: Conn) -> None:
    """Backfills, a refund reopened, a job restarted: the deadline is older than the
    look-back, so only the sweep (every `sweep`, 10m by default) reads it."""
    conn.execute(TABLE)
    late = rule()
    migrate(conn, [late])
    plan = prepare(conn, late)
    conn.execute("INSERT INTO orders VALUES (1, 7, 'pending', %s, '')", (T0,))
    now = T0 + 100 * H
    assert claim_all(conn, plan, now) == 0  # the first scan sweeps: nothing open
    conn.execute("UPDATE orders SET status = 'paid'")  # opens with a deadline 99 h ago
    assert claim_all(conn, plan, now + M) == 0  # before the look-back's reach
    assert claim_all(conn, plan, now + 10 * M) == 1  # the sweep
    assert claim_all(conn, plan, now + 11 * M) == 0
    assert episodes(conn, "late") == [("1", 1, 1)]


def test_episodes_end_at_a_re_notification_or_at_the_sweep(conn: Conn) -> None:
    conn.execute(TABLE)
    late = rule(renotify=None)  # notified once: only the sweep sees its end
    migrate(conn, [late])
    plan = prepare(conn, late)
    conn.execute("INSERT INTO orders VALUES (1, 7, 'paid', %s, '')", (T0,))
    now = T0 + 2 * H
    assert claim_all(conn, plan, now) == 1
    conn.execute("UPDATE orders SET status = 'on hold'")
    assert claim_all(conn, plan, now + 10 * M) == 0  # the sweep closes episode 1
    conn.execute("UPDATE orders SET status = 'paid'")  # reopened, same deadline
    assert claim_all(conn, plan, now + 20 * M) == 1  # the next sweep: episode 2
    assert episodes(conn, "late") == [("1", 1, 1), ("1", 2, 1)]


def test_a_scan_reads_what_fell_due_since_the_last_one_not_the_whole_backlog(
    conn: Conn,
) -> None:
    """Cost follows newly due rows: 2,000 rows notified and still open are not read
    again by later scans (only by the sweep)."""
    conn.execute(TABLE)
    late = rule(renotify=None)
    migrate(conn, [late])
    plan = prepare(conn, late)
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 'paid', %s, '' FROM generate_series(1, 2000) g",
        (T0 - 10 * 24 * H,),
    )
    conn.execute("INSERT INTO orders VALUES (5000, 7, 'paid', %s, '')", (T0 - 58 * M,))
    assert claim_all(conn, plan, T0) == 2000  # sweeps: the whole backlog once
    before = _due_index_reads(conn)
    assert claim_all(conn, plan, T0 + 3 * M) == 1  # order 5000, due a minute ago
    assert _due_index_reads(conn) - before <= 5  # the window, not the 2,000 notified


def test_a_row_committed_after_its_scan_is_found_within_the_look_back(conn: Conn) -> None:
    """A transaction that wrote a deadline and committed a few seconds after the scan
    that would have seen it: the next scan's window reaches back for it."""
    conn.execute(TABLE)
    late = rule(every="30s")
    migrate(conn, [late])
    plan = prepare(conn, late)
    assert claim_all(conn, plan, T0) == 0  # the first scan (a sweep); watermark T0
    # Due at T0 - 5 s, committed after the scan at T0.
    conn.execute("INSERT INTO orders VALUES (1, 7, 'paid', %s, '')", (T0 - H - 5 * S,))
    assert claim_all(conn, plan, T0 + 30 * S) == 1
    assert episodes(conn, "late") == [("1", 1, 1)]


def test_a_scan_re_reads_one_scan_interval_not_minutes_of_notified_rows(conn: Conn) -> None:
    """The look-back is one scan interval (at least 10 s): rows notified by the last
    scan two minutes ago are not read again by the next one."""
    conn.execute(TABLE)
    late = rule(every="30s")
    migrate(conn, [late])
    plan = prepare(conn, late)
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 'paid', %s + g * interval '100 milliseconds', ''"
        " FROM generate_series(1, 300) g",
        (T0 - H - 2 * M,),  # due from two minutes before T0 on
    )
    assert claim_all(conn, plan, T0 - M) == 300  # sweeps, and notifies all 300
    conn.execute("INSERT INTO orders VALUES (5000, 7, 'paid', %s, '')", (T0 - H - 10 * S,))
    before = _due_index_reads(conn)
    assert claim_all(conn, plan, T0) == 1
    assert _due_index_reads(conn) - before <= 5


@pytest.mark.parametrize("resolve", [False, True])
def test_a_batch_is_priced_as_a_batch_so_no_jit_compiles_it(conn: Conn, resolve: bool) -> None:
    """The planner's estimate for a batch of 10,000 stays near 10,000 rows all the
    way to the outbox, so the statement is priced below ``jit_above_cost``: JIT
    compilation took 0.2-0.4 s of a batch that takes 0.6 s without it."""
    conn.execute(TABLE)
    late = rule(batch=10_000, resolve=resolve)
    migrate(conn, [late])
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 'paid', %s + g * interval '1 second', ''"
        " FROM generate_series(1, 30000) g",
        (T0 - 10 * DAY,),
    )
    conn.execute("ANALYZE orders")
    plan = prepare(conn, late)
    assert plan.table is not None
    (doc,) = conn.execute(
        sql.SQL("EXPLAIN (FORMAT JSON) ") + plan.table.claim,
        plan.params(T0) | {"since": "-infinity"},
    ).fetchone()  # type: ignore[misc]
    (jit_above,) = conn.execute("SELECT current_setting('jit_above_cost')::float").fetchone()  # type: ignore[misc]
    assert doc[0]["Plan"]["Total Cost"] < jit_above


def test_a_batch_builds_the_json_of_its_own_rows_only(conn: Conn) -> None:
    """Once the state table has statistics the planner may hash the claim's anti join:
    it then reads and sorts every row due in the window, and the alerts' JSON must
    not be built for each of them (a drain of a 100,000 backlog built it 50,000 times
    a batch of 10,000), only for the batch, after the LIMIT."""
    conn.execute(TABLE)
    late = rule(batch=2)
    migrate(conn, [late])
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 'paid', %s + g * interval '1 second', ''"
        " FROM generate_series(1, 5) g",
        (T0 - DAY,),
    )
    plan = prepare(conn, late)
    assert plan.table is not None
    with conn.transaction():
        conn.execute("SET LOCAL enable_nestloop = off")  # the plan a big backlog gets
        conn.execute("SET LOCAL enable_mergejoin = off")
        (doc,) = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON) ") + plan.table.claim,
            plan.params(T0) | {"since": "-infinity"},
        ).fetchone()  # type: ignore[misc]
        raise psycopg.Rollback()  # EXPLAIN ANALYZE wrote the batch: undone
    fresh = next(p for p in plan_nodes(doc[0]["Plan"]) if p.get("Subplan Name") == "CTE fresh")
    nodes = list(plan_nodes(fresh))
    assert any(n["Node Type"] == "Hash Join" for n in nodes)  # the hashed anti join
    built = [n["Actual Rows"] for n in nodes if "jsonb_build_object" in str(n.get("Output"))]
    assert built and max(built) == 2


@pytest.mark.parametrize("resolve", [False, True])
def test_a_batch_pairs_the_episodes_it_opened_with_their_rows_whatever_the_estimates(
    conn: Conn, resolve: bool
) -> None:
    """The episodes `opened` and `renotified` wrote get their rows from `fresh` and
    `checked` in one pass. Joined, those CTEs were planned on their estimates, and
    statistics from before a backlog put `fresh` at 1 row: a nested loop comparing each
    opened row with every fresh one (10,000 x 10,000 in a 22 s batch of
    bench/scale.py's drain)."""
    conn.execute(TABLE)
    late = rule(batch=5000, resolve=resolve)
    migrate(conn, [late])
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 'paid', %s + g * interval '1 second', ''"
        " FROM generate_series(1, 2000) g",
        (T0 - 10 * DAY,),
    )
    plan = prepare(conn, late)
    assert plan.table is not None
    assert claim_all(conn, plan, T0 - 9 * DAY) == 2000
    for table in ("orders", "slawatch.late_state"):
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        conn.execute(f"ANALYZE {table}")
    conn.execute(  # half the deadlines move, to a time still due: 1,000 new episodes;
        # the other half are due for their re-notification
        "UPDATE orders SET paid_at = %s + id * interval '1 millisecond' WHERE id <= 1000",
        (T0 - 2 * H,),
    )
    # The joins such estimates get (statistics from before the backlog did it in
    # bench/scale.py's drain): nested loops.
    wrote, quadratic = batch_with_nested_loops(
        conn, plan.table.claim, plan.params(T0) | {"since": "-infinity"}
    )
    assert (wrote["CTE opened"], wrote["CTE renotified"]) == (1000, 1000)
    assert wrote["CTE alerts"] == 2000
    assert quadratic == []


def test_an_alert_carries_the_columns_asked_for_whatever_the_key_and_deadline(
    conn: Conn,
) -> None:
    """The batch reads the key, the deadline's columns and the alert's columns from
    the watched row, even when ``columns`` names neither the key nor the deadline."""
    conn.execute(TABLE)
    late = rule(columns=["note"], renotify=None)
    migrate(conn, [late])
    conn.execute("INSERT INTO orders VALUES (1, 7, 'paid', %s, 'fragile')", (T0 - 2 * H,))
    assert claim_all(conn, prepare(conn, late), T0) == 1
    got = alerts_of(conn, "late", "key", "deadline", "row_data")
    assert got == [("1", T0 - 2 * H, {"note": "fragile"})]


def test_four_scanners_without_row_locks_page_each_row_once(conn: Conn, dsn: str) -> None:
    conn.execute(TABLE)
    late = rule(renotify={"every": "1m", "max": 3}, batch=50)
    migrate(conn, [late])
    conn.execute(
        "INSERT INTO orders SELECT g, 7, 'paid', %s - g * interval '1 second', ''"
        " FROM generate_series(1, 600) g",
        (T0,),
    )
    errors: list[BaseException] = []

    def scanner(now: datetime) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                plan = prepare(own, late)
                for _ in range(3):
                    claim_all(own, plan, now)
        except BaseException as exc:  # reported below
            errors.append(exc)

    for step in range(3):  # #1, then #2 and #3 a minute apart each
        now = T0 + 2 * H + step * (M + S)
        threads = [threading.Thread(target=scanner, args=(now,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    keys: dict[int, list[str]] = {}  # by n, in order
    for n, key in alerts_of(conn, "late", "n", "key"):
        keys.setdefault(n, []).append(key)
    got = [(n, len(of_n), len(set(of_n))) for n, of_n in keys.items()]
    assert got == [(1, 600, 600), (2, 600, 600), (3, 600, 600)]


def test_a_due_re_notification_is_checked_against_the_watched_row(conn: Conn) -> None:
    """Between two sweeps, a re-notification is sent only if the row is still open with
    the episode's deadline; otherwise the episode is closed there and then."""
    conn.execute(TABLE)
    late = rule(renotify={"every": "2m", "max": 5})
    migrate(conn, [late])
    plan = prepare(conn, late)
    conn.execute(
        "INSERT INTO orders VALUES (1, 7, 'paid', %(t)s, ''), (2, 7, 'paid', %(t)s, ''),"
        " (3, 7, 'paid', %(t)s, '')",
        {"t": T0},
    )
    now = T0 + H + S
    assert claim_all(conn, plan, now) == 3  # sweeps (the first scan)
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    conn.execute("UPDATE orders SET paid_at = paid_at + interval '1 day' WHERE id = 2")
    assert claim_all(conn, plan, now + 2 * M + S) == 1  # only order 3; no sweep yet
    state = conn.execute("SELECT id, sw_seen IS NULL FROM slawatch.late_state ORDER BY id")
    assert state.fetchall() == [(1, True), (2, True), (3, False)]
    assert episodes(conn, "late") == [("1", 1, 1), ("2", 1, 1), ("3", 1, 1), ("3", 1, 2)]


def test_check_dry_run_and_run_once_agree_on_a_backfill(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """A row inserted already overdue right after a run (a backfill: its deadline is
    long before the watermark's look-back, and no sweep is due): `check` and
    `run --dry-run` count it, and `run --once` sends it at once, not at the next sweep."""
    from tests.integration.test_cli import slawatch

    rules = tmp_path / "rules"
    rules.mkdir()
    text = (ROOT / "rules" / "order_unshipped.yaml").read_text()
    (rules / "order_unshipped.yaml").write_text(f"{text}\ntrack: table\n")
    shop(conn, "table")
    now = datetime.now(UTC)
    conn.execute("INSERT INTO orders VALUES (1, 1, 100, 'paid', %s)", (now - 3 * DAY,))

    def once() -> int:
        result = slawatch("--rules", str(rules), "run", "--once", "--json", dsn=dsn)
        assert result.returncode == 0, result.stderr
        return int(json.loads(result.stdout)["rules"]["order_unshipped"]["claimed"])

    def checked() -> str:
        result = slawatch("--rules", str(rules), "check", dsn=dsn)
        assert result.returncode == 0, result.stderr
        (line,) = [ln for ln in result.stdout.splitlines() if "order_unshipped:" in ln]
        return line.strip()

    def dry_run() -> int:
        result = slawatch("--rules", str(rules), "run", "--dry-run", "--json", dsn=dsn)
        assert result.returncode == 0, result.stderr
        return int(json.loads(result.stdout)["rules"][0]["first"])

    assert once() == 1  # the first drain; the watermark is now
    conn.execute("INSERT INTO orders VALUES (2, 1, 100, 'paid', %s)", (now - 10 * DAY,))
    assert checked() == "order_unshipped: 1 rows would be notified on the next scan"
    assert dry_run() == 1
    assert once() == 1
    assert episodes(conn, "order_unshipped") == [("1", 1, 1), ("2", 1, 1)]
    assert checked() == "order_unshipped: 0 rows would be notified on the next scan"
    assert (dry_run(), once()) == (0, 0)
