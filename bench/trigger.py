"""What each way of tracking costs the shop's own writes: `track: table`'s one partial
index, `track: inline`'s columns and indexes, and the alternative issue 7 asked to
measure, a trigger on `orders` feeding slawatch's state table.

The workload is the application's, not slawatch's: orders placed (INSERT pending),
paid (UPDATE status, paid_at) and shipped (UPDATE status, shipped_at), each statement
its own transaction as a web request's would be, on the 16-column shop table of
bench/run.py with its 7 business indexes. Each variant runs on a fresh copy of the
same database; the variants interleave; medians of --reps runs. Not a test.

    .venv/bin/python bench/trigger.py              # ~1 minute
    .venv/bin/python bench/trigger.py --orders 20000 --reps 5

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

# ruff: noqa: RUF001

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdb import Scratch
from run import RULE, load_shop, rule_dict

from slawatch.config.rules import Rule
from slawatch.engine.migrate import migrate

# The trigger way: every write that leaves an order open with a deadline upserts its
# (key, deadline) into a queue slawatch owns; the claim would read the queue instead
# of the watched table. (Only the feed is built here: its cost lands on the shop.)
TRIGGER = """
CREATE SCHEMA IF NOT EXISTS slawatch;
CREATE TABLE slawatch.order_unshipped_feed (
    id bigint PRIMARY KEY, deadline timestamptz NOT NULL
);
CREATE INDEX order_unshipped_feed_deadline ON slawatch.order_unshipped_feed (deadline);
CREATE FUNCTION slawatch.order_unshipped_feed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'paid' AND NEW.paid_at IS NOT NULL THEN
        INSERT INTO slawatch.order_unshipped_feed (id, deadline) VALUES (NEW.id, NEW.paid_at)
        ON CONFLICT (id) DO UPDATE SET deadline = excluded.deadline
         WHERE slawatch.order_unshipped_feed.deadline IS DISTINCT FROM excluded.deadline;
    ELSIF TG_OP = 'UPDATE' AND OLD.status = 'paid' THEN
        DELETE FROM slawatch.order_unshipped_feed WHERE id = NEW.id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER order_unshipped_feed AFTER INSERT OR UPDATE OF status, paid_at ON orders
    FOR EACH ROW EXECUTE FUNCTION slawatch.order_unshipped_feed();
"""


def setup(conn: psycopg.Connection[Any], variant: str) -> None:
    if variant == "table":
        migrate(conn, [Rule.model_validate(rule_dict(10_000, "table"))])
    elif variant == "inline":
        migrate(conn, [Rule.model_validate(rule_dict(10_000))])
    elif variant == "trigger":
        conn.execute(TRIGGER)
    conn.execute("VACUUM ANALYZE orders")
    conn.execute("CHECKPOINT")


def workload(dsn: str, first: int, orders: int) -> float:
    """Statements per second of ``orders`` lifecycles, one transaction each."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        t = time.perf_counter()
        for i in range(first, first + orders):
            conn.execute(
                "INSERT INTO orders VALUES (%s, %s, 'u' || %s || '@example.com', 'pending',"
                " 1999, 'EUR', 2, now(), NULL, NULL, now(), 'DE', 'standard', NULL, md5(%s::text),"
                " NULL)",
                (i, i % 200_000, i, i),
                prepare=True,
            )
            conn.execute(
                "UPDATE orders SET status = 'paid', paid_at = now(), updated_at = now()"
                " WHERE id = %s",
                (i,),
                prepare=True,
            )
        for i in range(first, first + orders):
            conn.execute(
                "UPDATE orders SET status = 'shipped', shipped_at = now(), updated_at = now()"
                " WHERE id = %s",
                (i,),
                prepare=True,
            )
        return 3 * orders / (time.perf_counter() - t)


def bulk(dsn: str, first: int, orders: int) -> float:
    """Rows per second of the same lifecycle in three set statements (an import, a
    batch job): no commit per row, so the per-row cost of each way shows."""
    last = first + orders - 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        t = time.perf_counter()
        conn.execute(
            "INSERT INTO orders SELECT g, g %% 200000, 'u' || g || '@example.com', 'pending',"
            " 1999, 'EUR', 2, now(), NULL, NULL, now(), 'DE', 'standard', NULL, md5(g::text),"
            " NULL FROM generate_series(%s::bigint, %s::bigint) g",
            (first, last),
        )
        conn.execute(
            "UPDATE orders SET status = 'paid', paid_at = now(), updated_at = now()"
            " WHERE id BETWEEN %s AND %s",
            (first, last),
        )
        conn.execute(
            "UPDATE orders SET status = 'shipped', shipped_at = now(), updated_at = now()"
            " WHERE id BETWEEN %s AND %s",
            (first, last),
        )
        return 3 * orders / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="orders already in the table")
    parser.add_argument("--orders", type=int, default=5_000, help="order lifecycles per run")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    variants = ["none", "table", "inline", "trigger"]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    bulk_rates: dict[str, list[float]] = {v: [] for v in variants}
    with Scratch() as scratch:
        scratch.create("shop")
        load_shop(scratch.dsn("shop"), args.rows, args.rows // 50, datetime.now(UTC))
        for v in variants:
            scratch.create(f"t_{v}", template="shop")
            with psycopg.connect(scratch.dsn(f"t_{v}"), autocommit=True) as conn:
                setup(conn, v)
        for rep in range(args.reps):
            for v in variants:
                scratch.create("run", template=f"t_{v}")
                rates[v].append(workload(scratch.dsn("run"), args.rows + 1, args.orders))
                bulk_rates[v].append(
                    bulk(scratch.dsn("run"), args.rows + args.orders + 1, 10 * args.orders)
                )
                scratch.drop("run")
            print(f"  run {rep + 1}: " + ", ".join(f"{v} {rates[v][-1]:,.0f}/s" for v in variants))
    base = statistics.median(rates["none"])
    print(
        f"\nTHE SHOP'S OWN WRITES: {args.orders:,} orders placed, paid and shipped"
        f" (3 statements, 3 transactions each) on {args.rows:,} orders with 7 business indexes;"
        f" medians of {args.reps}, statements/s"
    )
    labels = {
        "none": "no slawatch",
        "table": f"track: table (one partial index sw_{RULE}_due)",
        "inline": "track: inline (4 columns, 3 partial indexes)",
        "trigger": "a trigger feeding slawatch's state (not built)",
    }
    for v in variants:
        m = statistics.median(rates[v])
        print(f"  {labels[v]:<56} {m:>9,.0f}  {m / base:5.2f}×")
    base = statistics.median(bulk_rates["none"])
    print(
        f"\nTHE SAME IN BULK: {10 * args.orders:,} orders in three set statements"
        f" (an import or a batch job); medians of {args.reps}, rows/s"
    )
    for v in variants:
        m = statistics.median(bulk_rates[v])
        print(f"  {labels[v]:<56} {m:>9,.0f}  {m / base:5.2f}×")


if __name__ == "__main__":
    main()
