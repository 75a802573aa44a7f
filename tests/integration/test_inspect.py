"""What an operator reads (slawatch/operate/inspect.py, scans.py): rule status, the alerts
list and its pages, one alert, stats, and the record of each scan."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from slawatch.actions.run import runner
from slawatch.config.rules import Rule
from slawatch.db import Database, DatabaseUnavailable
from slawatch.engine.catalog import inspect_table, inspect_tables
from slawatch.engine.claim import DrainResult
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.errors import BadInput, ConfigError, NotFound, SlawatchError
from slawatch.operate import inspect as inspect_module
from slawatch.operate.inspect import (
    COUNT_LIMIT,
    get_alert,
    list_alerts,
    notified_statement,
    overdue_statement,
    rule_status,
    rules_report,
    stats,
)
from slawatch.runtime import scans
from tests.integration.helpers import Conn, FixedClock, claim_all, plans, shop, unversioned
from tests.integration.test_explain import nodes

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


def orders(conn: Conn, rows: list[tuple[int, str, datetime]]) -> None:
    conn.cursor().executemany(
        "INSERT INTO orders VALUES (%s, 1, 100, %s, %s)", [(i, s, t) for i, s, t in rows]
    )


def add_alert(
    conn: Conn, rule: str, key: str, fired_at: datetime, deliveries: dict[str, str], n: int = 1
) -> int:
    """One alert with a delivery per notifier in the given status; its id."""
    row = conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " VALUES (%s, %s, 1, %s, 'warning', %s, '{}') RETURNING id",
        (rule, key, n, fired_at),
    ).fetchone()
    assert row is not None
    for notifier, status in deliveries.items():
        conn.execute(
            "INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)"
            " VALUES (%s, %s, %s, %s)",
            (row[0], notifier, status, fired_at),
        )
    return int(row[0])


def test_rule_status_counts_through_the_indexes(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    due = NOW - timedelta(hours=49)  # order_unshipped: due 48 h after paid_at
    orders(
        conn,
        [
            (1, "paid", due),
            (2, "paid", due - HOUR),
            (3, "paid", due - 2 * HOUR),
            (4, "paid", NOW),  # not due yet
            (5, "shipped", due),  # completed
        ],
    )
    order, receipt = rules["order_unshipped"], rules["receipt_unconfirmed"]
    (before, no_renotify) = rule_status(conn, [order, receipt], NOW)
    assert (before.overdue, before.not_notified, before.notified) == (3, 3, 0)
    assert (before.pending, before.dead) == (0, 0)
    assert before.oldest_pending_seconds is None and before.last_scan is None
    assert before.problem is None and not before.overdue_capped
    assert not before.not_notified_capped
    assert no_renotify.notified is None  # notified once: none awaits a re-notification

    # Today's shape: the test makes one delivery dead and adds alerts in SQL (the rows'
    # counts: test_outbox_rows_read.py).
    plan = prepare(conn, order, outbox="alerts").with_act(runner("off"))
    assert claim_all(conn, plan, NOW) == 3
    conn.execute(
        "UPDATE slawatch.delivery SET status = 'dead' WHERE id = (SELECT min(id)"
        " FROM slawatch.delivery)"
    )
    # Notified, and still overdue: "overdue" counts them (it once said 0 here).
    (after,) = rule_status(conn, [order], NOW)
    assert (after.overdue, after.not_notified, after.notified) == (3, 0, 3)
    assert (after.pending, after.dead) == (2, 1)
    # Past the 6 h re-notify interval: all three are due again. A younger pending
    # delivery leaves the age of the oldest as it was.
    add_alert(conn, "order_unshipped", "9", NOW + 6 * HOUR, {"console": "pending"})
    (later,) = rule_status(conn, [order], NOW + 7 * HOUR)
    assert (later.overdue, later.not_notified, later.notified, later.pending) == (3, 0, 3, 3)
    assert later.oldest_pending_seconds == pytest.approx(7 * 3600)
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    (shipped,) = rule_status(conn, [order], NOW + 7 * HOUR)
    assert (shipped.overdue, shipped.not_notified) == (2, 0)


def test_overdue_counts_every_overdue_row_notified_or_not(conn: Conn, track: str) -> None:
    """The probe's case: a rule without renotify, 183 rows notified and still overdue.
    "overdue" is every row overdue now; "not notified" the next scan's first notices."""
    rules = shop(conn, track)
    rule = rules["order_unshipped"].model_copy(update={"renotify": None, "escalate": []})
    migrate(conn, [rule])
    due = NOW - timedelta(hours=49)
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 100, 'paid', %s - g * interval '1 minute'"
        " FROM generate_series(1, 183) g",
        (due,),
    )
    orders(conn, [(500, "paid", NOW), (501, "shipped", due)])  # not due; completed
    assert claim_all(conn, plans(conn, {"o": rule})["o"], NOW) == 183
    (status,) = rule_status(conn, [rule], NOW)
    assert (status.overdue, status.not_notified, status.notified) == (183, 0, None)

    # Two more fall due (one a backfill, paid a week ago); one notified row completes.
    orders(conn, [(600, "paid", due), (601, "paid", NOW - timedelta(days=7))])
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
    (status,) = rule_status(conn, [rule], NOW)
    assert (status.overdue, status.not_notified) == (184, 2)
    # A notified row whose deadline moved to a time already past: a new episode, not
    # yet notified; one whose deadline moved into the future is overdue no more.
    conn.execute("UPDATE orders SET paid_at = paid_at - interval '1 hour' WHERE id = 2")
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 3", (NOW,))
    (status,) = rule_status(conn, [rule], NOW)
    assert (status.overdue, status.not_notified) == (183, 3)
    later = NOW + 11 * MINUTE  # track: table: the backfill and the moved row need a sweep
    assert claim_all(conn, plans(conn, {"o": rule})["o"], later) == 3
    (status,) = rule_status(conn, [rule], later)
    assert (status.overdue, status.not_notified) == (183, 0)


def test_counting_overdue_rows_reads_the_rules_indexes(conn: Conn, track: str) -> None:
    """50,000 orders, 1 in 100 paid and overdue, half of those notified (no renotify:
    they await nothing): the count goes through the partial indexes, never a
    sequential scan of the watched table."""
    rules = shop(conn, track)
    rule = rules["order_unshipped"].model_copy(update={"renotify": None, "escalate": []})
    migrate(conn, [rule])
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 1, CASE WHEN mod(g, 100) = 0 THEN 'paid' ELSE 'shipped'"
        " END, %s - g * interval '1 minute' FROM generate_series(1, 50000) g",
        (NOW - timedelta(days=3),),
    )
    claim_all(conn, plans(conn, {"o": rule})["o"], NOW)  # all 500 notified
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 1, 'paid', %s - g * interval '1 minute'"
        " FROM generate_series(50001, 50250) g",
        (NOW - timedelta(days=3),),
    )
    conn.execute("ANALYZE orders")
    info = inspect_table(conn, "public", "orders")
    assert info is not None
    statement = overdue_statement(rule, info)
    cutoff = NOW - rule.after
    (plan,) = conn.execute(
        b"EXPLAIN (FORMAT JSON) " + statement.as_bytes(conn), {"cutoff": cutoff}
    ).fetchone()  # type: ignore[misc]
    tree = nodes(plan[0]["Plan"])
    scans = [n for n in tree if n.get("Relation Name") == "orders"]
    assert scans and not [n for n in scans if "Seq Scan" in n["Node Type"]], scans
    # (A bitmap scan names its index in a child node without the relation.)
    used = {n["Index Name"] for n in tree if n.get("Index Name", "").startswith("sw_")}
    wanted = {rule.first_index, rule.again_index} if track == "inline" else {rule.due_index}
    assert used == wanted, tree
    (status,) = rule_status(conn, [rule], NOW)
    assert (status.overdue, status.not_notified) == (750, 250)


def test_rule_status_names_a_missing_table_or_migration(conn: Conn) -> None:
    rules = shop(conn)
    conn.execute("DROP INDEX sw_order_unshipped_again")
    conn.execute("DROP TABLE refunds")
    order, refund = rule_status(conn, [rules["order_unshipped"], rules["refund_unprocessed"]], NOW)
    assert order.problem is not None and "sw_order_unshipped_again" in order.problem
    assert "slawatch migrate" in order.problem and order.overdue is None
    assert refund.problem == "table public.refunds does not exist"


def test_a_count_that_runs_out_of_time_costs_only_its_own_rule(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rules are counted in one request; a count that runs out of time (a table
    locked) fails the rest of it: the slow rule says it could not count, the rules
    counted before it keep their numbers (not counted again: their indexes are read as
    often as without the slow rule), and those after it are counted in a request of
    their own."""
    rules = shop(conn)
    orders(conn, [(1, "paid", NOW - timedelta(hours=49))])
    conn.execute(
        "INSERT INTO refunds VALUES (1, 1, 500, 'requested', %s)",
        (NOW - timedelta(days=30),),
    )
    monkeypatch.setattr(inspect_module, "READ_TIMEOUT", "200ms")
    order, refund, job = rules["order_unshipped"], rules["refund_unprocessed"], rules["job_hung"]

    def index_scans() -> int:  # of the indexes of the tables of refund and job
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT sum(idx_scan) FROM pg_stat_user_indexes"
            " WHERE schemaname = 'public' AND relname IN ('refunds', 'jobs')"
        ).fetchone()
        assert row is not None
        return int(row[0])

    before = index_scans()
    refund_alone, job_alone = rule_status(conn, [refund, job], NOW)
    alone = index_scans() - before
    assert refund_alone.overdue == 1 and job_alone.overdue == 0 and alone > 0
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE orders")
        before = index_scans()
        counted, slow, after = rule_status(conn, [refund, order, job], NOW)
        assert index_scans() - before == alone
    assert slow.problem is None and (slow.overdue, slow.notified) == (None, None)
    assert (counted.overdue, counted.not_notified) == (1, 1)
    assert counted.notified == refund_alone.notified
    assert (after.overdue, after.notified) == (job_alone.overdue, job_alone.notified) == (0, 0)


def shop_with_an_overdue_refund(conn: Conn) -> tuple[Rule, Rule, Rule, Rule]:
    """The shop's rules order_unshipped, refund_unprocessed, job_hung and
    receipt_unconfirmed, with one refund overdue (the others' tables empty)."""
    rules = shop(conn)
    conn.execute(
        "INSERT INTO refunds VALUES (1, 1, 500, 'requested', %s)",
        (NOW - timedelta(days=30),),
    )
    names = ("order_unshipped", "refund_unprocessed", "job_hung", "receipt_unconfirmed")
    order, refund, job, receipt = (rules[name] for name in names)
    return order, refund, job, receipt


def test_the_counts_together_stop_at_their_deadline(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each count waits at most READ_TIMEOUT, and all of them together at most
    COUNTS_TIMEOUT: with two tables locked, the first locked count waits out what is
    left of the deadline, not READ_TIMEOUT, and the rules not counted by then are shown
    not counted (as a count that ran out of time: no problem, no numbers), a table not
    locked too, instead of each locked table waiting READ_TIMEOUT of its own."""
    order, refund, job, receipt = shop_with_an_overdue_refund(conn)
    monkeypatch.setattr(inspect_module, "READ_TIMEOUT", "8s")
    monkeypatch.setattr(inspect_module, "COUNTS_TIMEOUT", 1.0)
    # The locks waited out as a slow count is (a lock timeout would end them sooner).
    monkeypatch.setattr(inspect_module, "COUNT_LOCK_TIMEOUT", "8s")
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE orders, jobs")  # ACCESS EXCLUSIVE, until the rollback
        started = time.monotonic()
        counted, *late = rule_status(conn, [refund, order, job, receipt], NOW)
        took = time.monotonic() - started
    assert (counted.overdue, counted.not_notified) == (1, 1)
    assert [(s.name, s.problem, s.overdue, s.notified) for s in late] == [
        (r.name, None, None, None) for r in (order, job, receipt)
    ]
    # About the 1 s bound; without it, 8 s a locked table (16 s), the receipts counted.
    assert took < 6, took
    (receipts,) = rule_status(conn, [receipt], NOW)  # the tables free again: counted
    assert receipts.overdue == 0


def test_a_locked_table_is_not_counted_at_once_and_the_rules_after_it_are(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count waits for a locked table at most COUNT_LOCK_TIMEOUT (the scans' 200 ms),
    not READ_TIMEOUT: with two tables of four rules locked, and READ_TIMEOUT and
    COUNTS_TIMEOUT far longer than the test, the locked two are shown not counted (as
    a count that ran out of time: no problem, no numbers) and the free two counted."""
    order, refund, job, receipt = shop_with_an_overdue_refund(conn)
    monkeypatch.setattr(inspect_module, "READ_TIMEOUT", "30s")
    monkeypatch.setattr(inspect_module, "COUNTS_TIMEOUT", 30.0)
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE orders, jobs")  # ACCESS EXCLUSIVE, until the rollback
        started = time.monotonic()
        statuses = rule_status(conn, [order, refund, job, receipt], NOW)
        took = time.monotonic() - started
    assert [(s.name, s.problem, s.overdue, s.not_notified) for s in statuses] == [
        (order.name, None, None, None),
        (refund.name, None, 1, 1),
        (job.name, None, None, None),
        (receipt.name, None, 0, 0),
    ]
    # Two lock timeouts and round trips; a count waiting its lock out would take 30 s.
    assert took < 10, took


def test_a_locked_table_of_a_deadline_expression_is_said_locked_not_wrong(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The type of a deadline expression is read by planning a statement over its
    table, which waits for an ACCESS EXCLUSIVE lock: the status (the page, /v1/rules,
    'slawatch status') waits at most the scans' lock timeout for it, and says the
    table is locked (not counted), never that the deadline is not a value of the
    table; the rules after it are counted. The table free again: counted."""
    from tests.integration.test_deadline_expr import NOW as TICKETS_NOW
    from tests.integration.test_deadline_expr import fill
    from tests.integration.test_deadline_expr import rule as ticket_rule

    rules = shop(conn)
    fill(conn, 50)
    ticket = ticket_rule()
    migrate(conn, [ticket])
    refund = rules["refund_unprocessed"]
    monkeypatch.setattr(inspect_module, "READ_TIMEOUT", "30s")
    monkeypatch.setattr(inspect_module, "COUNTS_TIMEOUT", 30.0)
    # A safety net, not the bound under test: a look-up that waited would end here.
    conn.execute("SET statement_timeout = '20s'")
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE tickets")  # ACCESS EXCLUSIVE, until the rollback
        locked, free = rule_status(conn, [ticket, refund], TICKETS_NOW)
    assert locked.problem is not None
    assert locked.problem.startswith("table public.tickets is locked; "), locked.problem
    assert "not a value" not in locked.problem
    assert (locked.overdue, locked.notified) == (None, None)
    assert free.problem is None and free.overdue == 0
    (counted,) = rule_status(conn, [ticket], TICKETS_NOW)
    assert counted.problem is None and counted.overdue is not None and counted.overdue > 0


def test_a_locked_table_of_a_query_rule_is_said_locked(
    conn: Conn, monkeypatch: pytest.MonkeyPatch, dsn: str
) -> None:
    """A query rule's columns are read by planning its query, which waits for a locked
    table as an expression deadline's type does: the status waits for it at most the
    lock timeout, and says a table its query reads is locked; the others are counted."""
    rules = shop(conn)
    paid = Rule.model_validate(
        {
            "name": "paid_late",
            "query": "SELECT id, paid_at, status FROM orders",
            "track": "table",
            "key": "id",
            "deadline": "paid_at",
            "after": "48h",
            "open_when": "status = 'paid'",
            "notify": ["console"],
        }
    )
    migrate(conn, [paid])
    orders(conn, [(1, "paid", NOW - timedelta(hours=49))])
    refund = rules["refund_unprocessed"]
    monkeypatch.setattr(inspect_module, "READ_TIMEOUT", "30s")
    monkeypatch.setattr(inspect_module, "COUNTS_TIMEOUT", 30.0)
    conn.execute("SET statement_timeout = '20s'")  # a safety net, as above
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE orders")  # ACCESS EXCLUSIVE, until the rollback
        locked, free = rule_status(conn, [paid, refund], NOW)
    assert locked.problem is not None
    assert locked.problem.startswith("a table rule paid_late's query reads is locked; ")
    assert (locked.overdue, free.problem, free.overdue) == (None, None, 0)
    (counted,) = rule_status(conn, [paid], NOW)
    assert (counted.problem, counted.overdue) == (None, 1)


def test_status_says_a_locked_table_of_a_deadline_expression_at_once(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """'slawatch status' with the table of an expression deadline locked: it answers
    (the subprocess's timeout is a safety net, far past the lock timeout), the rule
    not counted, its table said locked in the notes, not its deadline wrong."""
    from tests.integration.test_cli import slawatch
    from tests.integration.test_deadline_expr import IN_UTC, fill

    fill(conn, 10)
    (tmp_path / "ticket_late.yaml").write_text(
        f"table: public.tickets\ndeadline: \"{IN_UTC}\"\nopen_when: status = 'open'\n"
        "notify: [console]\n"
    )
    assert slawatch("--rules", str(tmp_path), "migrate", dsn=dsn).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE tickets")  # ACCESS EXCLUSIVE, until the rollback
        result = slawatch("--rules", str(tmp_path), "status", dsn=dsn, timeout=40)
    assert result.returncode == 0, result.stderr
    assert "ticket_late: table public.tickets is locked; " in result.stdout, result.stdout
    assert "not a value" not in result.stdout


def test_a_rule_changed_is_counted_as_it_is_now(conn: Conn, track: str) -> None:
    """Each rule's count statement is composed once, not on every look: a rule changed
    (loaded again, and migrated) is counted by its new definition, not its old one's."""
    rules = shop(conn, track)
    orders(conn, [(i, s, NOW - timedelta(hours=49)) for i, s in enumerate(["paid", "new", "new"])])
    order = rules["order_unshipped"]
    for _ in range(2):
        (status,) = rule_status(conn, [order], NOW)
        assert status.problem is None and status.overdue == 1
    wider = order.model_copy(update={"open_when": "status IN ('paid', 'new')"})
    migrate(conn, [wider])
    (status,) = rule_status(conn, [wider], NOW)
    assert status.problem is None and status.overdue == 3


def test_the_catalog_of_many_tables_at_once_is_each_ones(conn: Conn) -> None:
    """inspect_tables (the status of many rules) reads what inspect_table reads, table
    by table: columns, not-null, unique keys, primary key, a partitioned table's parts."""
    shop(conn)
    conn.execute("CREATE UNIQUE INDEX ON orders (user_id, id)")
    conn.execute(
        "CREATE TABLE parted (id bigint, at timestamptz NOT NULL, PRIMARY KEY (id, at))"
        " PARTITION BY RANGE (at)"
    )
    conn.execute(
        "CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')"
    )
    conn.execute("CREATE VIEW late_orders AS SELECT * FROM orders")
    names = [
        ("public", t)
        for t in ("orders", "jobs", "refunds", "shipments", "parted", "late_orders", "nope")
    ] + [("slawatch", "scan"), ("nope", "orders")]
    one_by_one = {n: inspect_table(conn, *n) for n in names}
    assert one_by_one[("public", "orders")] is not None
    assert len(one_by_one[("public", "orders")].unique_keys) == 2  # type: ignore[union-attr]
    assert inspect_tables(conn, names) == {n: i for n, i in one_by_one.items() if i is not None}


def test_status_before_migrate_says_so(conn: Conn) -> None:
    rules = shop(conn)
    conn.execute("DROP TABLE slawatch.scan")
    unversioned(conn)  # as a release from before the scan record left it
    with pytest.raises(ConfigError, match="run 'slawatch migrate' first"):
        rules_report(conn, rules.values(), NOW)
    migrate(conn, list(rules.values()))  # the upgrade adds what was missing
    assert rules_report(conn, rules.values(), NOW).rules


def test_counting_open_episodes_reads_the_renotify_index(conn: Conn, track: str) -> None:
    rules = shop(conn, track)
    rule = rules["order_unshipped"]
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 1, CASE WHEN mod(g, 100) = 0 THEN 'paid' ELSE 'shipped'"
        " END, %s - g * interval '1 minute' FROM generate_series(1, 50000) g",
        (NOW - timedelta(days=3),),
    )
    claim_all(conn, plans(conn, {"o": rule})["o"], NOW)
    conn.execute("ANALYZE orders")
    if track == "table":
        # Rows notified once and completed long ago stay in the state table, closed.
        conn.execute(
            "INSERT INTO slawatch.order_unshipped_state (id, sw_ep, sw_n)"
            " SELECT g, 1, 0 FROM generate_series(100001, 150000) g"
        )
        conn.execute("ANALYZE slawatch.order_unshipped_state")
    (plan,) = conn.execute(
        b"EXPLAIN (FORMAT JSON) " + notified_statement(rule).as_bytes(conn)
    ).fetchone()  # type: ignore[misc]
    text = str(plan)
    assert "Seq Scan" not in text, text
    wanted = rule.again_index if track == "inline" else "order_unshipped_state_again"
    assert wanted in text
    (status,) = rule_status(conn, [rule], NOW)
    assert status.notified == 500


def test_a_like_pattern_in_open_when_is_counted_through_the_indexes(conn: Conn, track: str) -> None:
    """open_when's `%` stays a LIKE wildcard in every count, with or without parameters,
    so each statement's predicate is the index's, word for word."""
    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={"open_when": "status LIKE 'pai%'"}
    )
    migrate(conn, [rule])
    conn.execute(
        "INSERT INTO orders SELECT g, 1, 1, CASE WHEN mod(g, 100) = 0 THEN 'paid' ELSE 'shipped'"
        " END, %s - g * interval '1 minute' FROM generate_series(1, 20000) g",
        (NOW - timedelta(days=3),),
    )
    claim_all(conn, plans(conn, {"o": rule})["o"], NOW)
    orders(conn, [(30000, "paid", NOW - timedelta(days=3))])
    conn.execute("ANALYZE orders")
    info = inspect_table(conn, "public", "orders")
    assert info is not None
    for statement, params in (
        (overdue_statement(rule, info), {"cutoff": NOW - rule.after}),
        (notified_statement(rule), None),
    ):
        (plan,) = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + statement.as_bytes(conn), params
        ).fetchone()  # type: ignore[misc]
        scans = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "orders"]
        assert not [n for n in scans if "Seq Scan" in n["Node Type"]], scans
    (status,) = rule_status(conn, [rule], NOW)
    assert (status.overdue, status.not_notified, status.notified) == (201, 1, 200)


def test_overdue_count_stops_at_the_limit(conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = shop(conn)
    monkeypatch.setattr("slawatch.operate.inspect.COUNT_LIMIT", 3)
    orders(conn, [(i, "paid", NOW - timedelta(days=3)) for i in range(1, 6)])
    (status,) = rule_status(conn, [rules["order_unshipped"]], NOW)
    assert (status.overdue, status.overdue_capped) == (3, True)
    assert (status.not_notified, status.not_notified_capped) == (3, True)
    # Notified rows count towards the same limit; the not notified ones stay exact.
    claim_all(conn, plans(conn, {"o": rules["order_unshipped"]})["o"], NOW)
    orders(conn, [(9, "paid", NOW - timedelta(days=3))])
    (status,) = rule_status(conn, [rules["order_unshipped"]], NOW)
    assert (status.overdue, status.overdue_capped) == (3, True)
    assert (status.not_notified, status.not_notified_capped) == (1, False)
    assert COUNT_LIMIT == 100_000


def test_alerts_filters_and_keyset_pages(conn: Conn) -> None:
    shop(conn)
    ids = []
    for i in range(12):
        rule = "order_unshipped" if i % 2 else "job_hung"
        status = ("sent", "pending", "dead")[i % 3]
        ids.append(add_alert(conn, rule, f"k{i}", NOW + i * HOUR, {"console": status}))
    everything = list_alerts(conn, limit=1000)
    assert [a.id for a in everything.alerts] == ids[::-1]  # newest first
    assert everything.next_cursor is None

    # Pages of 5: each alert exactly once, in order, and the last page says so.
    seen, cursor = [], None
    for _ in range(10):
        page = list_alerts(conn, limit=5, cursor=cursor)
        seen += [a.id for a in page.alerts]
        cursor = int(page.next_cursor) if page.next_cursor else None
        if cursor is None:
            break
    assert seen == ids[::-1]

    odd = list_alerts(conn, rule="order_unshipped").alerts
    assert {a.key for a in odd} == {f"k{i}" for i in range(1, 12, 2)}
    dead = list_alerts(conn, status="dead").alerts
    assert {a.key for a in dead} == {"k2", "k5", "k8", "k11"}
    assert all(a.deliveries[0].status == "dead" for a in dead)
    recent = list_alerts(conn, since=NOW + 9 * HOUR).alerts
    assert [a.key for a in recent] == ["k11", "k10", "k9"]
    pending = list_alerts(conn, rule="job_hung", status="pending").alerts
    assert [a.key for a in pending] == ["k10", "k4"]
    all_three = list_alerts(conn, rule="job_hung", status="pending", since=NOW + 5 * HOUR)
    assert [a.key for a in all_three.alerts] == ["k10"]
    assert [a.key for a in list_alerts(conn, rule="job_hung", status="sent").alerts] == [
        "k6",
        "k0",
    ]
    assert list_alerts(conn, rule="no_such_rule").alerts == []


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"limit": 0}, "limit: 0 is not from 1 to 1000"),
        ({"limit": 1001}, "limit: 1001"),
        ({"status": "gone"}, "status: 'gone' is not one of pending, sent, dead, silenced, summ"),
        ({"rule": "Robert'); DROP TABLE"}, "is not a rule name"),
        ({"rule": "x" * 10_000}, "(10,000 characters)"),
    ],
)
def test_alerts_refuse_bad_filters(conn: Conn, kwargs: dict[str, Any], says: str) -> None:
    shop(conn)
    with pytest.raises(BadInput, match=None) as caught:
        list_alerts(conn, **kwargs)
    assert says in str(caught.value)


def test_one_alert_by_number_or_idempotency_id(conn: Conn) -> None:
    shop(conn)
    key = '(42,"2026-03-01 00:00:00+00")'  # a composite key's text holds ':'
    number = add_alert(conn, "order_unshipped", key, NOW, {"console": "sent", "pager": "dead"}, 3)
    by_number = get_alert(conn, str(number))
    assert by_number.idempotency_id == f"order_unshipped:{key}:e1:n3"
    assert [(d.notifier, d.status) for d in by_number.deliveries] == [
        ("console", "sent"),
        ("pager", "dead"),
    ]
    assert get_alert(conn, by_number.idempotency_id) == by_number
    for missing in (
        str(number + 1),
        f"order_unshipped:{key}:e1:n4",
        "9" * 19,
        "x:1:e9999999999:n1",
        "-1",  # an element of the outbox's rows (queries.sql, alert_by_id): none here
    ):
        with pytest.raises(NotFound):
            get_alert(conn, missing)
    for bad in ("--1", "order_unshipped:42", "a\x00b", "Rule:1:e1:n1"):
        with pytest.raises(BadInput):
            get_alert(conn, bad)


def test_stats_count_by_rule_severity_and_notifier_status(conn: Conn) -> None:
    shop(conn)
    add_alert(conn, "job_hung", "1", NOW, {"console": "sent", "pager": "pending"})
    add_alert(conn, "job_hung", "2", NOW, {"console": "dead"})
    add_alert(conn, "order_unshipped", "1", NOW, {"console": "sent"})
    got = stats(conn)
    assert [(c.rule, c.severity, c.alerts) for c in got.alerts] == [
        ("job_hung", "warning", 2),
        ("order_unshipped", "warning", 1),
    ]
    assert [(c.notifier, c.status, c.deliveries) for c in got.deliveries] == [
        ("console", "dead", 1),
        ("console", "sent", 2),
        ("pager", "pending", 1),
    ]


def test_each_scan_is_recorded_and_a_failure_with_its_error(conn: Conn, dsn: str) -> None:
    rules = shop(conn)
    rule = rules["order_unshipped"]
    clock = FixedClock(NOW)
    with Database(dsn, size=1) as db:
        assert scans.recorded(db, rule.name, clock, lambda r: DrainResult(7, 1)).claimed == 7
        (status,) = rule_status(conn, [rule], NOW + timedelta(seconds=5))
        assert status.last_scan is not None
        assert (status.last_scan.at, status.last_scan.claimed) == (NOW, 7)
        assert status.last_scan.error is None and status.last_scan.duration_ms >= 0

        def failing(name: str) -> DrainResult:
            raise SlawatchError("claim for rule order_unshipped: permission denied")

        with pytest.raises(SlawatchError):
            scans.recorded(db, rule.name, FixedClock(NOW + HOUR), failing)
        (status,) = rule_status(conn, [rule], NOW)
        assert status.last_scan is not None and status.last_scan.at == NOW + HOUR
        assert status.last_scan.error == "claim for rule order_unshipped: permission denied"

        def unreachable(name: str) -> DrainResult:
            raise DatabaseUnavailable("database down")

        # Not recorded: writing would wait for the same unreachable database.
        with pytest.raises(DatabaseUnavailable):
            scans.recorded(db, rule.name, FixedClock(NOW + 2 * HOUR), unreachable)
        (status,) = rule_status(conn, [rule], NOW)
        assert status.last_scan is not None and status.last_scan.at == NOW + HOUR


def test_the_runner_records_its_scans(conn: Conn, dsn: str) -> None:
    from slawatch.runtime.scheduler import Runner

    rules = shop(conn)
    orders(conn, [(1, "paid", NOW - timedelta(days=3))])
    runner = Runner(dsn, [rules["order_unshipped"]], [], clock=FixedClock(NOW))
    try:
        assert runner.scan("order_unshipped") is not None
    finally:
        runner.close()
    (status,) = rule_status(conn, [rules["order_unshipped"]], NOW)
    assert status.last_scan is not None and status.last_scan.claimed == 1


def test_run_once_records_its_scans(conn: Conn, dsn: str) -> None:
    """`slawatch status` after `run --once` shows that scan, not "never"."""
    from slawatch.runtime.scheduler import Runner

    rules = shop(conn)
    orders(conn, [(1, "paid", NOW - timedelta(days=3)), (2, "paid", NOW - timedelta(days=3))])
    runner = Runner(dsn, [rules["order_unshipped"]], [], clock=FixedClock(NOW))
    try:
        assert not runner.once().failed
    finally:
        runner.close()
    (status,) = rule_status(conn, [rules["order_unshipped"]], NOW)
    assert status.last_scan is not None and status.last_scan.claimed == 2
