"""Partitioned watched tables: per-partition indexes built without blocking, and a
claim that addresses rows by (partition, ctid), since a ctid alone names a slot in
every partition."""

from __future__ import annotations

import itertools
import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from slawatch.config.rules import Rule
from slawatch.engine.claim import claim_batch
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.errors import ConfigError
from tests.integration.helpers import Conn, alerts, alerts_of

T0 = datetime(2026, 3, 1, tzinfo=UTC)
MONTHS = ["2026-01-01", "2026-02-01", "2026-03-01", "2026-04-01"]


def partitioned_orders(conn: Conn, months: list[str] = MONTHS) -> None:
    conn.execute(
        "CREATE TABLE orders (id bigint NOT NULL, status text NOT NULL, paid_at timestamptz"
        " NOT NULL, UNIQUE (id, paid_at)) PARTITION BY RANGE (paid_at)"
    )
    for start, end in itertools.pairwise(months):
        add_month(conn, start, end)


def add_month(conn: Conn, start: str, end: str) -> None:
    name = "orders_" + start[:7].replace("-", "_")
    conn.execute(
        f"CREATE TABLE {name} PARTITION OF orders FOR VALUES FROM ('{start}') TO ('{end}')"
    )
    conn.execute(f"ALTER TABLE {name} ADD UNIQUE (id)")  # the key, unique in each partition


def rule(**fields: Any) -> Rule:
    base = {
        "name": "late",
        "table": "public.orders",
        "key": ["id", "paid_at"],  # a key unique across partitions includes the partition key
        "deadline": "paid_at",
        "after": "1d",
        "open_when": "status = 'paid'",
        "renotify": {"every": "1h", "max": 3},
        "notify": ["console"],
    }
    return Rule.model_validate(base | fields)


def late(conn: Conn) -> list[tuple[str, int]]:
    """(order id, n) of every alert of rule late, in order."""
    return sorted((str(data["id"]), n) for data, n in alerts_of(conn, "late", "row_data", "n"))


def child_indexes(conn: Conn) -> list[tuple[str, str, bool]]:
    rows = conn.execute(
        "SELECT t.relname, c.relname, i.indisvalid FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
        " WHERE c.relname LIKE 'sw_late_%' ORDER BY 1, 2"
    ).fetchall()
    return [(t, c, v) for t, c, v in rows]


def test_migrate_builds_each_partition_and_new_partitions_inherit(conn: Conn) -> None:
    partitioned_orders(conn)
    done = migrate(conn, [rule()])
    assert "public.orders: built index sw_late_first (3 partitions)" in done
    indexes = child_indexes(conn)
    assert len(indexes) == 3 + 3 * 3 and all(valid for _, _, valid in indexes)
    assert migrate(conn, [rule()]) == []  # idempotent
    add_month(conn, "2026-04-01", "2026-05-01")  # a month later, a new partition
    inherited = conn.execute(
        "SELECT count(*) FILTER (WHERE i.indisvalid) FROM pg_inherits h"
        " JOIN pg_index i ON i.indexrelid = h.inhrelid"
        " WHERE h.inhparent IN ('sw_late_first'::regclass, 'sw_late_again'::regclass,"
        " 'sw_late_ended'::regclass)"
        " AND i.indrelid = 'orders_2026_04'::regclass"
    ).fetchone()
    assert inherited == (3,)
    assert migrate(conn, [rule()]) == []
    done = migrate(conn, [rule(open_when="status IN ('paid', 'packed')")])
    assert "public.orders: dropped index sw_late_first (definition changed)" in done
    assert all(valid for _, _, valid in child_indexes(conn))
    prepare(conn, rule(open_when="status IN ('paid', 'packed')"))


def test_only_due_rows_are_claimed_though_ctids_repeat_across_partitions(conn: Conn) -> None:
    partitioned_orders(conn)
    migrate(conn, [rule()])
    # The first row of every partition sits at ctid (0,1); only January's is due.
    conn.execute(
        "INSERT INTO orders VALUES (1, 'paid', '2026-01-10'), (2, 'paid', '2026-02-28 12:00'),"
        " (3, 'paid', '2026-03-01 00:00:00+00')"
    )
    ctids = conn.execute("SELECT DISTINCT ctid::text FROM orders").fetchall()
    assert ctids == [("(0,1)",)]
    plan = prepare(conn, rule())
    assert claim_batch(conn, plan, T0) == 1
    assert late(conn) == [("1", 1)]
    untouched = conn.execute("SELECT id FROM orders WHERE sw_late_n = 0 ORDER BY id").fetchall()
    assert untouched == [(2,), (3,)]
    # Re-notification goes through the second index, in the right partition too.
    assert claim_batch(conn, plan, T0 + timedelta(hours=13)) == 2  # 1 again, and 2 now due
    assert late(conn) == [("1", 1), ("1", 2), ("2", 1)]


def test_claim_plan_uses_the_partition_indexes(conn: Conn) -> None:
    partitioned_orders(conn)
    conn.execute(
        "INSERT INTO orders SELECT g, CASE WHEN mod(g, 100) = 0 THEN 'paid' ELSE 'shipped' END,"
        " timestamptz '2026-01-01' + mod(g, 88) * interval '1 day' FROM generate_series(1, 30000) g"
    )
    migrate(conn, [rule()])
    conn.execute("ANALYZE orders")
    plan = prepare(conn, rule())
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + plan.statement.as_bytes(conn), plan.params(T0)
        ).fetchone()
    assert row is not None
    text = json.dumps(row[0])

    # No partition is read whole. The one table scanned is slawatch's episode history,
    # empty here and priced at the planner's guess of 10 pages; holding rows, it is
    # read by a Tid Scan of the episodes the claim ends.
    def scanned(node: dict[str, Any]) -> set[str]:
        here = {node["Relation Name"]} if node["Node Type"] == "Seq Scan" else set()
        return here.union(*(scanned(child) for child in node.get("Plans", [])))

    assert scanned(row[0][0]["Plan"]) <= {"episode"}
    assert "sw_late_first_" in text and "sw_late_again_" in text and "sw_late_ended_" in text
    assert '"Tid Scan"' in text


def test_four_scanners_on_a_partitioned_table(conn: Conn, dsn: str) -> None:
    partitioned_orders(conn)
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', timestamptz '2026-01-01' + mod(g, 58) * interval"
        " '1 day' FROM generate_series(1, 4000) g"
    )
    late = rule(batch=100)
    migrate(conn, [late])
    plan = prepare(conn, late)
    now = datetime(2026, 6, 1, tzinfo=UTC)
    counts = [0] * 4
    start = threading.Barrier(4)

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            start.wait()
            empty = 0
            while empty < 3:
                got = claim_batch(c, plan, now)
                counts[i] += got
                empty = empty + 1 if got == 0 else 0

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 4000
    keys = sorted(data["id"] for (data,) in alerts_of(conn, "late", "row_data"))
    assert keys == list(range(1, 4001))


def test_sub_partitions_and_keys_not_unique_per_partition_are_refused(conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE orders (id bigint NOT NULL, status text, paid_at timestamptz NOT NULL)"
        " PARTITION BY RANGE (paid_at)"
    )
    conn.execute(
        "CREATE TABLE orders_2026 PARTITION OF orders FOR VALUES FROM ('2026-01-01')"
        " TO ('2027-01-01')"
    )
    with pytest.raises(ConfigError, match=r"key: \(id, paid_at\) of public.orders has no uniq"):
        migrate(conn, [rule()])
    # Unique in each partition is not enough: per-tenant ids repeat across partitions.
    conn.execute("ALTER TABLE orders_2026 ADD UNIQUE (id)")
    with pytest.raises(ConfigError, match=r"a unique index of the parent: add the partition key"):
        migrate(conn, [rule(key="id")])
    conn.execute(
        "CREATE TABLE orders_2027 PARTITION OF orders FOR VALUES FROM ('2027-01-01')"
        " TO ('2028-01-01') PARTITION BY LIST (status)"
    )
    with pytest.raises(ConfigError, match="has sub-partitions"):
        migrate(conn, [rule()])


def test_a_due_row_locked_in_another_partition_at_the_same_slot_is_not_waited_for(
    conn: Conn, dsn: str
) -> None:
    """The (tableoid, ctid) match: the claim's TID scan probes the picked slot in every
    partition; without the match it would reach the same slot of another partition, find
    a due row there that another transaction holds, and wait for it (or claim it)."""
    partitioned_orders(conn)
    migrate(conn, [rule()])
    conn.execute("INSERT INTO orders VALUES (1, 'paid', '2026-01-10'), (2, 'paid', '2026-02-10')")
    plan = prepare(conn, rule())
    with psycopg.connect(dsn) as holder:  # the application, busy with order 2
        holder.execute("SELECT 1 FROM orders WHERE id = 2 FOR UPDATE")
        conn.execute("SET lock_timeout = '3s'")  # waiting would fail the claim
        assert claim_batch(conn, plan, T0) == 1
        holder.rollback()
    assert late(conn) == [("1", 1)]
    assert claim_batch(conn, plan, T0) == 1  # order 2, now free
    assert late(conn) == [("1", 1), ("2", 1)]


def test_the_claim_rechecks_each_row_it_updates(conn: Conn) -> None:
    """The claim's UPDATE re-checks the due predicate on every row it reaches. Shown by
    taking the partition match away: the TID scan then reaches the same slot in every
    partition, and only the re-check keeps the rows there that are not due unclaimed."""
    from slawatch.engine.claim import plan_claim

    partitioned_orders(conn)
    migrate(conn, [rule()])
    conn.execute(
        "INSERT INTO orders VALUES (1, 'paid', '2026-01-10'), (2, 'shipped', '2026-02-10'),"
        " (3, 'paid', '2026-03-25')"  # shipped, and not due yet: both at ctid (0,1)
    )
    unmatched = plan_claim(rule(), "timestamp with time zone", partitioned=False, key=["id"])
    assert claim_batch(conn, unmatched, T0) == 1
    assert late(conn) == [("1", 1)]


def test_a_composite_primary_key_is_the_default_key(conn: Conn) -> None:
    """Partitioned tables as people build them: the primary key includes the partition
    key. The rule names no key; the alert's key is one readable string."""
    conn.execute(
        "CREATE TABLE orders (id bigint, status text NOT NULL, paid_at timestamptz NOT NULL,"
        " PRIMARY KEY (id, paid_at)) PARTITION BY RANGE (paid_at)"
    )
    for start, end in itertools.pairwise(MONTHS):
        name = "orders_" + start[:7].replace("-", "_")
        conn.execute(
            f"CREATE TABLE {name} PARTITION OF orders FOR VALUES FROM ('{start}') TO ('{end}')"
        )
    keyless = rule(key=None)
    migrate(conn, [keyless])
    conn.execute("INSERT INTO orders VALUES (1, 'paid', '2026-01-10'), (1, 'paid', '2026-02-10')")
    plan = prepare(conn, keyless)
    assert claim_batch(conn, plan, T0) == 2  # the same id in two months: two rows
    keys = [k for k, *_ in alerts(conn, "late")]
    assert keys == ['(1,"2026-01-10 00:00:00+00")', '(1,"2026-02-10 00:00:00+00")']
    first = alerts_of(conn, "late", "key", "row_data")[0]
    assert first[1] == {"id": 1, "paid_at": "2026-01-10T00:00:00+00:00"}
    with pytest.raises(ConfigError, match=r"key: \(paid_at\) of public.orders has no unique"):
        migrate(conn, [rule(key="paid_at")])
