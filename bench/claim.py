"""Claim throughput: slawatch's claim (with its outbox) beside the bare SQL of
docs/explanation/claim.md.

Loads a watched table of ROWS rows of which DUE are overdue, then drains them in
batches, once with the raw UPDATE ... RETURNING (no outbox: the limit of the
technique) and once with slawatch's claim (alerts + deliveries written in the same
statement); then slawatch's claim again on the same rows in a table hash-partitioned
into each of PARTITIONS parts. Prints a table. Not a test: figures depend on the machine.

    .venv/bin/python bench/claim.py [--rows 1000000] [--due 100000] [--batch 10000]
                                    [--partitions 12,100]

Kept for partitioned tables; the benchmark of record is bench/run.py (a shop table
with business indexes, the seed's statement as written, medians of interleaved runs).

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
from benchdb import scratch_database

from slawatch.config.rules import Rule
from slawatch.engine.claim import claim_batch, plan_claim
from slawatch.engine.migrate import migrate

NOW = datetime(2026, 6, 1, tzinfo=UTC)

RAW = """
UPDATE bench_orders SET sw_bench_n = sw_bench_n + 1,
       sw_bench_next = CASE WHEN sw_bench_n + 1 >= 5 THEN NULL
                            ELSE %(now)s::timestamptz + interval '6 hours' END
 WHERE ctid = ANY (ARRAY(
       (SELECT ctid FROM bench_orders WHERE paid_at < %(cutoff)s::timestamptz
            AND sw_bench_n = 0 AND (status = 'paid') ORDER BY paid_at LIMIT %(batch)s::int)
       UNION ALL
       (SELECT ctid FROM bench_orders WHERE sw_bench_next < %(now)s::timestamptz
            AND sw_bench_next IS NOT NULL AND (status = 'paid')
            ORDER BY sw_bench_next LIMIT %(batch)s::int)
       LIMIT %(batch)s::int))
RETURNING id, user_id, total_cents, paid_at"""


def load(
    conn: psycopg.Connection[tuple[object, ...]], rows: int, due: int, partitions: int = 0
) -> Rule:
    conn.execute("DROP TABLE IF EXISTS bench_orders; DROP SCHEMA IF EXISTS slawatch CASCADE")
    conn.execute(
        "CREATE TABLE bench_orders (id bigint PRIMARY KEY, user_id bigint, total_cents int,"
        " status text NOT NULL, paid_at timestamptz)"
        + (" PARTITION BY HASH (id)" if partitions else "")
    )
    for i in range(partitions):
        conn.execute(
            f"CREATE TABLE bench_orders_{i} PARTITION OF bench_orders"
            f" FOR VALUES WITH (MODULUS {partitions}, REMAINDER {i})"
        )
    # Every (rows/due)-th order is paid and overdue; the rest shipped long ago.
    step = max(rows // due, 1)
    conn.execute(
        "INSERT INTO bench_orders SELECT g, mod(g, 50000), 1000 + mod(g, 9000),"
        " CASE WHEN mod(g, %(step)s::int) = 0 THEN 'paid' ELSE 'shipped' END,"
        " %(now)s::timestamptz - interval '3 days' - g * interval '1 second'"
        " FROM generate_series(1, %(rows)s::int) g",
        {"step": step, "now": NOW, "rows": rows},
    )
    rule = Rule.model_validate(
        {
            "name": "bench",
            "table": "bench_orders",
            "key": "id",
            "deadline": "paid_at",
            "after": "48h",
            "open_when": "status = 'paid'",
            "renotify": {"every": "6h", "max": 5},
            "columns": ["id", "user_id", "total_cents", "paid_at"],
            "notify": ["ops"],
        }
    )
    migrate(conn, [rule])
    conn.execute("VACUUM ANALYZE bench_orders")
    return rule


def reset(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute(
        "UPDATE bench_orders SET sw_bench_n = 0, sw_bench_next = NULL, sw_bench_seen = NULL,"
        " sw_bench_ep = 0 WHERE sw_bench_n > 0"
    )
    conn.execute("TRUNCATE slawatch.alert, slawatch.delivery, slawatch.episode")
    conn.execute("VACUUM ANALYZE bench_orders")
    conn.execute("CHECKPOINT")


def drain(step: Callable[[], int], batch: int) -> tuple[int, list[float]]:
    total, times = 0, []
    while True:
        t = time.perf_counter()
        got = step()
        times.append(time.perf_counter() - t)
        total += got
        if got < batch:
            return total, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--partitions", default="12,100", help="comma-separated; '' for none")
    args = parser.parse_args()

    with scratch_database() as db, psycopg.connect(db, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        t = time.perf_counter()
        rule = load(conn, args.rows, args.due)
        loaded = time.perf_counter() - t
        print(
            f"PostgreSQL {version[0] if version else '?'}; {args.rows:,} rows, "
            f"{args.due:,} due, batch {args.batch:,}; loaded in {loaded:.1f}s\n"
        )
        rule = rule.model_copy(update={"batch": args.batch})
        plan = plan_claim(rule, "timestamp with time zone")
        params = {"now": NOW, "cutoff": NOW - timedelta(hours=48), "batch": args.batch}

        def raw() -> int:
            with conn.transaction():
                return len(conn.execute(RAW, params).fetchall())

        def slawatch() -> int:
            return claim_batch(conn, plan, NOW)

        variants = [
            ("raw UPDATE ... RETURNING (§1)", raw),
            ("slawatch claim + outbox", slawatch),
        ]
        print(
            f"{'variant':<38} {'rows':>8} {'batches':>7} {'seconds':>8} {'rows/s':>9}"
            f" {'ms/batch p50':>12} {'max':>7}"
        )

        def report(label: str, step: Callable[[], int]) -> None:
            reset(conn)
            t = time.perf_counter()
            total, times = drain(step, args.batch)
            secs = time.perf_counter() - t
            ms = [x * 1000 for x in times]
            print(
                f"{label:<38} {total:>8,} {len(times):>7}"
                f" {secs:>8.2f} {total / secs:>9,.0f} {statistics.median(ms):>12.1f}"
                f" {max(ms):>7.1f}"
            )

        for round_ in range(2):
            for label, step in variants:
                report(f"{label} (run {round_ + 1})", step)
        for parts in [int(p) for p in args.partitions.split(",") if p.strip()]:
            rule = load(conn, args.rows, args.due, parts).model_copy(update={"batch": args.batch})
            part_plan = plan_claim(rule, "timestamp with time zone", partitioned=True)
            for round_ in range(2):
                report(
                    f"slawatch, {parts} partitions (run {round_ + 1})",
                    lambda plan=part_plan: claim_batch(conn, plan, NOW),
                )


if __name__ == "__main__":
    main()
