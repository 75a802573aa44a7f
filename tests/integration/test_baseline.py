"""First deployment without a flood (``slawatch migrate --baseline``): what is overdue
at the baseline is never paged; what falls due afterwards is, on both tracks."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from slawatch.clock import Clock
from slawatch.config.rules import Rule
from slawatch.engine.baseline import Progress, baseline_rule, recorded, render
from slawatch.engine.catalog import inspect_table
from slawatch.engine.claim import ClaimPlan
from slawatch.engine.due import count_due
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.errors import DatabaseError
from slawatch.runtime.scheduler import Runner
from tests.conftest import ROOT
from tests.integration.helpers import Conn, alerts, claim_all, episodes, shop

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DAY = timedelta(days=1)
NOW = T0 + 48 * H + H  # every order paid at or before T0 is overdue (order_unshipped: 48 h)
SWEPT = 11 * M  # track: table sweeps at most every 10 minutes

# Every alert (id, key, n, kind, notifiers), in either shape of the outbox: the elements
# of the rows (id -(row id * 128 + place)) with the notifiers of the row's sends, and
# slawatch.alert with those of its deliveries (docs/explanation/outbox-rows.md).
ALERTS = """\
    SELECT -(r.id * 128 + u.p) AS id, u.key, u.n, r.kind,
           ARRAY(SELECT s.notifier FROM slawatch.outbox_send s WHERE s.row_id = r.id) AS notifiers
      FROM slawatch.outbox_row r, unnest(r.keys, r.ns) WITH ORDINALITY AS u(key, n, p)
    UNION ALL
    SELECT a.id, a.key, a.n, a.kind, array_remove(array_agg(d.notifier), NULL)
      FROM slawatch.alert a LEFT JOIN slawatch.delivery d ON d.alert_id = a.id
     GROUP BY a.id"""


def resolved(conn: Conn) -> list[tuple[str, int]]:
    """(key, notifiers) of every resolved notice, in either shape of the outbox."""
    rows = conn.execute(
        f"SELECT key, cardinality(notifiers) FROM ({ALERTS}) a WHERE kind = 'resolved' ORDER BY 1"
    )
    return rows.fetchall()


def orders(conn: Conn, track: str, resolve: bool = False) -> tuple[Rule, ClaimPlan]:
    rule = shop(conn, track)["order_unshipped"].model_copy(update={"resolve": resolve})
    migrate(conn, [rule])
    return rule, prepare(conn, rule)


def overdue(conn: Conn, count: int, first_id: int = 1) -> None:
    """``count`` paid orders, paid a second apart going back from T0: all overdue at NOW."""
    conn.execute(
        "INSERT INTO orders SELECT g, g %% 100, 100, 'paid', %s - g * interval '1 second'"
        " FROM generate_series(%s::bigint, %s::bigint) g",
        (T0, first_id, first_id + count - 1),
    )


def baseline(conn: Conn, rule: Rule, now: datetime = NOW, **kw: Any) -> int:
    info = inspect_table(conn, rule.schema_name, rule.table_name)
    assert info is not None
    return baseline_rule(conn, rule, info, now, **kw)


def state(conn: Conn, rule: Rule, track: str) -> list[tuple[Any, ...]]:
    """Every row's tracking state with its xmin: a write shows even if it changed nothing."""
    if track == "inline":
        q = sql.SQL("SELECT id, xmin::text, {}, {}, {}, {} FROM orders ORDER BY id").format(
            *(sql.Identifier(c) for c in rule.tracking_columns)
        )
    else:
        q = sql.SQL(
            "SELECT id, xmin::text, sw_seen, sw_ep, sw_n, sw_next FROM {} ORDER BY id"
        ).format(sql.Identifier("slawatch", f"{rule.name}_state"))
    return conn.execute(q).fetchall()


def due(conn: Conn, rule: Rule, now: datetime) -> int | None:
    info = inspect_table(conn, rule.schema_name, rule.table_name)
    assert info is not None
    return count_due(conn, rule, info, now)


def test_a_baseline_pages_nothing_and_a_row_due_afterwards_pages(conn: Conn, track: str) -> None:
    rule, plan = orders(conn, track)
    overdue(conn, 20_000)
    assert due(conn, rule, NOW) == 20_000
    seen: list[Progress] = []
    assert baseline(conn, rule, progress=seen.append) == 20_000
    assert [p.rows for p in seen] == [10_000, 20_000, 20_000]  # batches of 10,000
    assert [p.finished for p in seen] == [False, False, True]
    assert due(conn, rule, NOW + M) == 0
    assert claim_all(conn, plan, NOW + M) == 0
    # An order that falls due after the baseline pages, once.
    conn.execute("INSERT INTO orders VALUES (0, 1, 100, 'paid', %s)", (NOW - 48 * H + 30 * S,))
    assert due(conn, rule, NOW + 2 * M) == 1
    assert claim_all(conn, plan, NOW + 2 * M) == 1
    assert episodes(conn, "order_unshipped") == [("0", 1, 1)]
    assert claim_all(conn, plan, NOW + SWEPT) == 0
    assert recorded(conn)["order_unshipped"].rows == 20_000
    assert recorded(conn)["order_unshipped"].at == NOW


def test_a_baseline_is_idempotent(conn: Conn, track: str) -> None:
    rule, plan = orders(conn, track)
    overdue(conn, 300)
    assert baseline(conn, rule, batch=100) == 300
    before = state(conn, rule, track)
    assert len(before) == 300
    again: list[Progress] = []
    assert baseline(conn, rule, NOW + M, batch=100, progress=again.append) == 0
    assert [p.batches for p in again] == [1]  # nothing even picked
    assert state(conn, rule, track) == before  # nothing written, not even the same values
    assert recorded(conn)["order_unshipped"].rows == 300
    assert claim_all(conn, plan, NOW + M) == 0


def test_a_batch_reads_on_from_where_the_last_ended(conn: Conn, track: str) -> None:
    """The index entries the baseline reads grow with the rows, not with rows x batches."""
    rule, _ = orders(conn, track)
    overdue(conn, 5_000)
    index = rule.first_index if track == "inline" else rule.due_index

    def entries_read() -> int:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = %s", (index,)
        ).fetchone()
        assert row is not None
        return int(row[0])

    before = entries_read()
    assert baseline(conn, rule, batch=500) == 5_000
    # From the start each time, it would be 500 + 1,000 + ... + 5,000 = 27,500.
    assert entries_read() - before < 2 * 5_000


def test_an_interrupted_baseline_resumes(conn: Conn, dsn: str, track: str) -> None:
    """The connection is killed after the second batch: the batches done stay done,
    and the next baseline finishes the rest."""
    rule, plan = orders(conn, track)
    overdue(conn, 2_500)
    victim = psycopg.connect(dsn, autocommit=True)
    pid = victim.info.backend_pid

    def kill(p: Progress) -> None:
        if p.batches == 2:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with victim, pytest.raises(DatabaseError, match="baseline of rule order_unshipped"):
        baseline(victim, rule, batch=1_000, progress=kill)
    assert recorded(conn)["order_unshipped"].rows == 2_000
    assert due(conn, rule, NOW) == 500
    assert baseline(conn, rule, batch=1_000) == 500
    assert recorded(conn)["order_unshipped"].rows == 2_500
    assert claim_all(conn, plan, NOW + M) == 0


def test_a_baseline_cut_short_by_a_statement_timeout_resumes(
    conn: Conn, dsn: str, track: str
) -> None:
    """Order 500, in the second batch, is held by another transaction: that batch waits
    and the statement_timeout cancels it; the first batch stays done."""
    rule, plan = orders(conn, track)
    overdue(conn, 2_000)  # in deadline order: ids 2000..1001, then 1000..1

    def impatient(p: Progress) -> None:
        if p.batches == 1:
            conn.execute("SET statement_timeout = '200ms'")

    with psycopg.connect(dsn) as blocker:  # in a transaction until the block ends
        if track == "inline":
            blocker.execute("SELECT 1 FROM orders WHERE id = 500 FOR UPDATE")
        else:
            blocker.execute(
                "INSERT INTO slawatch.order_unshipped_state (id, sw_seen) VALUES (500, %s)", (T0,)
            )
        with pytest.raises(DatabaseError, match="statement timeout"):
            baseline(conn, rule, batch=1_000, progress=impatient)
        blocker.rollback()
    conn.execute("RESET statement_timeout")
    assert recorded(conn)["order_unshipped"].rows == 1_000
    assert baseline(conn, rule, batch=1_000) == 1_000
    assert claim_all(conn, plan, NOW + M) == 0


def test_a_baseline_leaves_notified_episodes_alone(conn: Conn, track: str) -> None:
    """Order 1 was paged (episode open, re-notifications due every 6 h); order 2 was
    paged and its deadline then moved to another time already due; order 3 never was."""
    rule, plan = orders(conn, track)
    conn.execute(
        "INSERT INTO orders VALUES (1, 1, 100, 'paid', %(t)s), (2, 1, 100, 'paid', %(t)s)",
        {"t": T0},
    )
    assert claim_all(conn, plan, T0 + 48 * H + S) == 2
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 2", (T0 - 30 * M,))
    conn.execute("INSERT INTO orders VALUES (3, 1, 100, 'paid', %s)", (T0,))
    at = T0 + 48 * H + 2 * S
    assert baseline(conn, rule, at) == 1  # order 3 only
    # Order 2's new overdue stretch is paged (episode 2); order 1's re-notification too.
    assert claim_all(conn, plan, at + SWEPT) == 1
    assert claim_all(conn, plan, T0 + 54 * H + 2 * S + 2 * SWEPT) == 2
    assert episodes(conn, "order_unshipped") == [
        ("1", 1, 1),
        ("1", 1, 2),
        ("2", 1, 1),
        ("2", 2, 1),
        ("2", 2, 2),
    ]


def test_a_baselined_row_that_completes_sends_no_resolved_notice(conn: Conn, track: str) -> None:
    rule, plan = orders(conn, track, resolve=True)
    overdue(conn, 3)
    assert baseline(conn, rule) == 3
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id IN (1, 2)")
    conn.execute("DELETE FROM orders WHERE id = 3")
    for t in (NOW + M, NOW + SWEPT + M, NOW + 2 * SWEPT + M, NOW + 7 * H):
        assert claim_all(conn, plan, t) == 0
    assert resolved(conn) == []
    assert alerts(conn, rule.name) == []


def test_a_baselined_row_pages_in_a_new_episode(conn: Conn, track: str) -> None:
    """Order 1's deadline moves later: it pages when newly due. Order 2 completes and is
    reopened after a scan saw it complete: it pages again, as episode 1."""
    rule, plan = orders(conn, track, resolve=True)
    overdue(conn, 2)
    assert baseline(conn, rule) == 2
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 1", (NOW - 48 * H + H,))
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 2")
    assert claim_all(conn, plan, NOW + SWEPT) == 0  # the scan (table: sweep) sees both
    conn.execute("UPDATE orders SET status = 'paid' WHERE id = 2")
    assert claim_all(conn, plan, NOW + 2 * SWEPT) == 1  # order 2
    assert claim_all(conn, plan, NOW + H + S) == 1  # order 1, newly due
    assert episodes(conn, "order_unshipped") == [("1", 1, 1), ("2", 1, 1)]
    assert resolved(conn) == []


def test_a_baseline_reaches_only_the_rows_due_at_its_cutoff(conn: Conn, track: str) -> None:
    rule, plan = orders(conn, track)
    overdue(conn, 5)
    conn.execute("INSERT INTO orders VALUES (9, 1, 100, 'paid', %s)", (NOW - 48 * H + M,))
    conn.execute("INSERT INTO orders VALUES (10, 1, 100, 'shipped', %s)", (T0,))
    assert baseline(conn, rule) == 5
    assert claim_all(conn, plan, NOW + 2 * M) == 1
    assert episodes(conn, "order_unshipped") == [("9", 1, 1)]


def test_the_printed_baseline_does_what_migrate_does(conn: Conn, track: str) -> None:
    """The DO blocks of ``migrate --print --baseline`` (run as psql would, in autocommit)."""
    rule, plan = orders(conn, track)
    overdue(conn, 2_500)
    # A % in open_when: written once in the script, doubled only for psycopg's parameters.
    rule = rule.model_copy(update={"open_when": "status = 'paid' AND length('%') = 1"})
    migrate(conn, [rule])
    plan = prepare(conn, rule)
    info = inspect_table(conn, rule.schema_name, rule.table_name)
    assert info is not None
    script = render(rule, info, NOW, batch=1_000)
    (block,) = re.findall(
        r"^DO \$slawatch_baseline\$.*?\$slawatch_baseline\$;", script, re.S | re.M
    )
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute(block.encode())
    assert notices == [f"rule order_unshipped: {n} rows baselined" for n in (1000, 2000, 2500)]
    assert recorded(conn)["order_unshipped"].rows == 2_500
    conn.execute(block.encode())  # again: nothing more
    assert recorded(conn)["order_unshipped"].rows == 2_500
    assert baseline(conn, rule) == 0
    assert claim_all(conn, plan, NOW + M) == 0


@pytest.mark.big
@pytest.mark.parametrize("rows", [1_000_000])
def test_a_million_overdue_rows(conn: Conn, track: str, rows: int) -> None:
    """The issue's case at full size (``-m big``; the suite runs the 20,000-row one):
    prints the timings."""
    rule, plan = orders(conn, track)
    overdue(conn, rows)
    conn.execute("VACUUM ANALYZE orders")
    started = time.monotonic()
    assert baseline(conn, rule) == rows
    took = time.monotonic() - started
    started = time.monotonic()
    assert claim_all(conn, plan, NOW + M) == 0
    first_scan = time.monotonic() - started
    conn.execute("INSERT INTO orders VALUES (0, 1, 100, 'paid', %s)", (NOW - 48 * H + 30 * S,))
    started = time.monotonic()
    assert claim_all(conn, plan, NOW + 2 * M) == 1
    print(
        f"\n{track}: baseline of {rows:,} rows {took:.1f} s; first scan after it"
        f" {first_scan:.2f} s; the next {time.monotonic() - started:.3f} s"
    )


# --- What the next scan would send: check's count and run --dry-run ---------------------


def outbox(conn: Conn) -> tuple[dict[str, int], dict[str, int]]:
    """(alerts by kind, deliveries by notifier) written so far."""
    kinds = dict(conn.execute(f"SELECT kind, count(*) FROM ({ALERTS}) a GROUP BY 1").fetchall())
    sent = dict(
        conn.execute(
            f"SELECT x.notifier, count(*) FROM ({ALERTS}) a, unnest(a.notifiers) AS x(notifier)"
            " GROUP BY 1"
        ).fetchall()
    )
    return kinds, sent


def predicted(conn: Conn, rule: Rule, now: datetime) -> tuple[dict[str, int], dict[str, int]]:
    from slawatch.engine.due import count

    info = inspect_table(conn, rule.schema_name, rule.table_name)
    assert info is not None
    d = count(conn, rule, info, now)
    assert d is not None
    return {"firing": d.notices, "resolved": sum(d.resolved.values())}, d.deliveries(rule)


def grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}


class MovingClock(Clock):
    """The application clock at the time the test sets."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


def test_the_count_is_what_run_once_then_sends(conn: Conn, dsn: str, track: str) -> None:
    """First notices, re-notifications (one acked), a tier that adds a notifier,
    resolved notices (a completed row, a moved deadline), baselined rows, and a row
    backfilled with a deadline long before the last scan (`track: table` finds it only
    by a sweep, which `run --once` makes whether or not one is due): at each step the
    count made just before equals what `run --once` (Runner.once) writes."""
    from slawatch.config.rules import Tier

    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={
            "resolve": True,
            "notify": ["ops"],
            "escalate": [Tier(from_=2, notify=["ops", "pager"])],
        }
    )
    migrate(conn, [rule])
    overdue(conn, 3, first_id=100)
    assert baseline(conn, rule, T0 + 48 * H) == 3  # orders 100..102: never counted
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 100, 'paid', %s FROM generate_series(1, 5) g", (T0,)
    )
    due_at = T0 + 48 * H + S
    steps = [
        (due_at, None),
        (due_at + 6 * H + SWEPT, "change"),  # re-notifications, sweep, resolved notices
        (due_at + 6 * H + SWEPT + M, "backfill"),  # a minute after the last sweep
        (due_at + 12 * H + 2 * SWEPT, None),
    ]
    clock = MovingClock(due_at)
    # No notifiers: `run --once` drains and writes the outbox; nothing is sent.
    runner = Runner(dsn, [rule], [], clock=clock)
    try:
        for at, what in steps:
            clock.at = at
            if what == "change":
                first_alert = conn.execute(
                    f"SELECT id FROM ({ALERTS}) a WHERE key = '2' AND n = 1"
                ).fetchone()
                assert first_alert is not None
                conn.execute(
                    "INSERT INTO slawatch.ack (rule, key, episode, alert_id, acked_at, acked_by)"
                    " VALUES ('order_unshipped', '2', 1, %s, %s, 'test')",
                    (first_alert[0], at),
                )
                conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 3")
                conn.execute("UPDATE orders SET paid_at = %s WHERE id = 4", (T0 - H,))
            if what == "backfill":
                # Paid (imported) ten days ago: due long before the watermark's look-back.
                conn.execute("INSERT INTO orders VALUES (50, 1, 100, 'paid', %s)", (T0 - 10 * DAY,))
            before = outbox(conn)
            alerts, deliveries = predicted(conn, rule, at)
            result = runner.once()
            assert result.errors == []
            after = outbox(conn)
            assert {k: v for k, v in grew(before[0], after[0]).items()} == {
                k: v for k, v in alerts.items() if v or k in after[0]
            }, at
            assert {k: v for k, v in grew(before[1], after[1]).items() if v} == {
                k: v for k, v in deliveries.items() if v
            }, at
            if what == "backfill":
                assert alerts == {"firing": 1, "resolved": 0}
    finally:
        runner.close()
    # The walk met every kind: firing to both tiers, resolved notices, acks, baselines,
    # and the backfilled order (#1, then #2 six hours later).
    kinds, sent = outbox(conn)
    assert kinds == {"firing": 5 + 3 + 3 + 2, "resolved": 2}, kinds
    assert sent["pager"] > 0
    assert [e for e in episodes(conn, "order_unshipped") if e[0] == "50"] == [
        ("50", 1, 1),
        ("50", 1, 2),
    ]


def test_a_dry_run_writes_nothing(conn: Conn, dsn: str, track: str, tmp_path: Path) -> None:
    from tests.integration.test_cli import slawatch

    rules = tmp_path / "rules"
    rules.mkdir()
    text = (ROOT / "rules" / "order_unshipped.yaml").read_text()
    (rules / "order_unshipped.yaml").write_text(f"{text}\ntrack: {track}\nresolve: true\n")

    rule, plan = orders(conn, track, resolve=True)
    overdue(conn, 4)
    claim_all(conn, plan, NOW)  # 4 open episodes, tracked, a watermark (table)
    overdue(conn, 2, first_id=10)
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")

    def snapshot() -> tuple[Any, ...]:
        counts = tuple(
            conn.execute(sql.SQL("SELECT count(*), max(xmin::text) FROM {}").format(t)).fetchone()
            for t in (
                sql.Identifier("slawatch", "alert"),
                sql.Identifier("slawatch", "delivery"),
                sql.Identifier("slawatch", "watermark"),
                sql.Identifier("slawatch", "baseline"),
            )
        )
        return counts, state(conn, rule, track)

    listener = psycopg.connect(dsn, autocommit=True)
    with listener:
        listener.execute("LISTEN slawatch_delivery")
        before = snapshot()
        result = slawatch("--rules", str(rules), "run", "--dry-run", dsn=dsn)
        assert result.returncode == 0, result.stderr
        assert snapshot() == before
        assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
    lines = result.stdout.splitlines()
    assert lines[0].endswith("nothing sent, nothing written")
    # At the real clock: orders 10 and 11 are due, 2..4 re-notify, 1's episode ended.
    assert lines[1:] == [
        "  order_unshipped: 6 alerts (2 first, 3 re-notifications, 1 resolved) -> console 6",
        "total: 6 alerts, 6 deliveries -> console 6",
    ]


def test_the_printed_baseline_of_a_database_not_migrated_yet(conn: Conn, dsn: str) -> None:
    """Before the first migrate an event rule's timer table does not exist: the printed
    baseline says so for it (the script above it creates the table) and goes on."""
    from slawatch.demo import SHOP
    from tests.integration.test_cli import slawatch

    conn.execute(SHOP)
    result = slawatch("migrate", "--print", "--baseline", dsn=dsn)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert (
        "-- parcel_undelivered: its timer table slawatch.parcel_undelivered_timers is created"
        " by the migration above; no timer to mark as seen yet"
    ) in result.stdout
    assert "$slawatch_baseline$" in result.stdout  # the other rules' DO blocks


def test_the_first_deployment_from_the_command_line(conn: Conn, dsn: str) -> None:
    from slawatch.demo import SHOP
    from tests.integration.test_cli import slawatch

    conn.execute(SHOP)
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 100, 'paid', now() - interval '3 days'"
        " FROM generate_series(1, 25) g"
    )
    result = slawatch("check", dsn=dsn)
    assert "  order_unshipped: 25 rows would be notified on the next scan" in result.stdout
    result = slawatch("migrate", "--baseline", "--rule", "order_unshipped", dsn=dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-2].startswith("baseline: order_unshipped: 25 rows marked as seen (1 batch, ")
    assert lines[-1].startswith("ok: baseline of 1 rules: 25 rows overdue at ")
    result = slawatch("check", dsn=dsn)
    assert result.returncode == 0, result.stderr
    assert (
        "  order_unshipped: 0 rows would be notified on the next scan"
        " (baseline: 25 rows marked as seen, " in result.stdout
    )
    result = slawatch("run", "--dry-run", "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["alerts"] == 0 and report["deliveries"] == {"console": 0}
    assert {r["rule"] for r in report["rules"]} == {
        "job_hung",
        "order_unshipped",
        "receipt_unconfirmed",
        "refund_unprocessed",
        "parcel_undelivered",
        "task_timeout",
    }


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["migrate", "--rule", "order_unshipped"], 2, "migrate: --rule goes with --baseline"),
        (["migrate", "--baseline", "--rule", "nope"], 2, "--rule: no rule named 'nope' in"),
        (["migrate", "--baseline", "--rule", "x" * 10_000], 2, "--rule: no rule named 'xxx"),
        (["migrate", "--print", "--baseline"], 2, "--print --baseline needs a database"),
        (["run", "--json"], 2, "--json goes with --once or --dry-run"),
        (["run", "--once", "--dry-run"], 2, "--dry-run sends nothing"),
    ],
)
def test_bad_baseline_and_dry_run_usage(args: list[str], code: int, text: str) -> None:
    from tests.integration.test_cli import assert_one_line_error, slawatch

    result = slawatch(*args)
    assert_one_line_error(result, code, text)
    assert len(result.stderr) < 300


def test_a_dry_run_refuses_what_run_refuses(conn: Conn, dsn: str) -> None:
    from slawatch.demo import SHOP
    from tests.integration.test_cli import assert_one_line_error, slawatch

    conn.execute(SHOP)
    result = slawatch("run", "--dry-run", dsn=dsn)
    assert_one_line_error(result, 2, "run 'slawatch migrate' first")


@pytest.mark.empty_database
def test_a_partitioned_table_is_baselined_batch_by_batch(conn: Conn, track: str) -> None:
    """A ctid names a slot in every partition: each batch must change only the rows it
    picked, not those at the same slots in other partitions."""
    from slawatch.engine.claim import claim_batch
    from tests.integration.test_partitioned import partitioned_orders
    from tests.integration.test_partitioned import rule as late_rule

    partitioned_orders(conn)
    conn.execute("CREATE SCHEMA slawatch")
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', m + g * interval '1 hour'"
        " FROM generate_series(1, 3) g, unnest(%s::timestamptz[]) m",
        (["2026-01-05", "2026-02-05"],),
    )
    rule = late_rule(track=track)
    migrate(conn, [rule])
    seen: list[Progress] = []
    assert baseline(conn, rule, T0, batch=2, progress=seen.append) == 6
    assert [p.rows for p in seen] == [2, 4, 6, 6]
    plan = prepare(conn, rule)
    assert (
        claim_all(conn, plan, T0 + M) if track == "table" else claim_batch(conn, plan, T0 + M)
    ) == 0


@pytest.mark.parametrize("track", ["inline", "table"])
def test_a_renamed_rule_pages_again_unless_baselined_or_named_as_before(
    conn: Conn, track: str
) -> None:
    """What docs/reference/rules.md (Renaming a rule) says: a rule's name is its
    identity (tracking columns or state table, alert ids), so a renamed rule is a new
    rule that pages every overdue row again; `migrate --baseline --rule NEW` before it
    runs marks them seen instead; `name: OLD` in the renamed file keeps the rule."""
    old, plan = orders(conn, track)
    overdue(conn, 3)
    assert claim_all(conn, plan, NOW) == 3  # paged under the old name
    renamed = old.model_copy(update={"name": "order_late"})
    again = old.model_copy(update={"name": "order_again"})
    migrate(conn, [old, renamed, again])
    # Named as before (name: order_unshipped in the renamed file): the same rule.
    assert claim_all(conn, prepare(conn, old), NOW + M) == 0
    # Not baselined: every row is paged again, with new ids.
    assert claim_all(conn, prepare(conn, again), NOW + M) == 3
    assert {e[0] for e in episodes(conn, "order_again")} == {"1", "2", "3"}
    # Baselined first (migrate --baseline --rule order_late): none is.
    assert baseline(conn, renamed, NOW + M) == 3
    assert claim_all(conn, prepare(conn, renamed), NOW + 2 * M) == 0
    assert episodes(conn, "order_late") == []
    # What falls due from then on pages under the new name.
    conn.execute("INSERT INTO orders VALUES (4, 4, 100, 'paid', %s)", (T0 + H + 2 * M,))
    assert claim_all(conn, prepare(conn, renamed), NOW + 3 * M) == 1
    assert episodes(conn, "order_late") == [("4", 1, 1)]
