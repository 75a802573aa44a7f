"""The SLA report's ``due`` count: as the claim has deadlines due (operate/report.py:
``width_bucket`` over the claim's cutoffs, per period) beside the wall-clock count it
replaced (``date_bin(deadline + after)``), on the same table and index.

Loads ROWS rows whose deadlines spread over DAYS days into a watched table with a
btree index on the deadline, then times, interleaved, REPS times each, ``--by hour``
and ``--by day`` over the whole window:

- ``date_bin``: the release before's count (its catalog read, its index check and
  its statement: wall-clock due time);
- ``cutoffs``: the report's count (``due_by_period``: the catalog, the index check,
  the count) for the same rule (no calendar);
- ``calendar``: the report's count for the rule with a business calendar (mon-fri
  09-17): its cutoffs computed in Python, one per period.

Prints the medians and the ratios to ``date_bin``. Not a test: figures depend on the
machine.

    .venv/bin/python bench/report_due.py [--rows 1000000] [--days 30] [--reps 5]

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from benchdb import scratch_database
from report import NOW, orders

from slawatch.config.calendars import Calendar
from slawatch.config.rules import Rule, check_calendar_names
from slawatch.engine.catalog import inspect_table
from slawatch.engine.migrate import migrate
from slawatch.operate.report import due_by_period, query

# The release before's check that the deadline column is indexed for every row.
INDEXED = """\
SELECT EXISTS (
    SELECT 1 FROM pg_index i
      JOIN pg_class c ON c.oid = i.indexrelid
      JOIN pg_am m ON m.oid = c.relam
      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
     WHERE i.indrelid = 'bench_orders'::regclass AND i.indpred IS NULL AND i.indisvalid
       AND m.amname = 'btree' AND a.attname = 'paid_at')"""

# Its count: each deadline's wall-clock due time binned per period.
DATE_BIN = """\
SELECT date_bin(%(step)s::interval, paid_at + %(after)s::interval, %(start)s::timestamptz),
       count(*)
  FROM bench_orders
 WHERE paid_at >= %(low)s AND paid_at < %(high)s
 GROUP BY 1"""


def rule(calendar: bool) -> Rule:
    made = Rule.model_validate(
        {
            "name": "bench_cal" if calendar else "bench",
            "table": "bench_orders",
            "key": "id",
            "deadline": "paid_at",
            "after": "4h",
            "open_when": "status = 'paid'",
            "notify": ["ops"],
        }
        | ({"calendar": "office"} if calendar else {})
    )
    office = Calendar.model_validate(
        {"name": "office", "timezone": "Europe/Berlin", "hours": {"mon-fri": "09:00-17:00"}}
    )
    check_calendar_names([made], {"office": office})
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--reps", type=int, default=5, help="measurements of each (>= 3)")
    args = parser.parse_args()
    plain, cal = rule(False), rule(True)

    with scratch_database() as db, psycopg.connect(db, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        orders(conn, args.rows, args.days)
        conn.execute("CREATE INDEX bench_orders_paid_at ON bench_orders (paid_at)")
        migrate(conn, [plain, cal])
        conn.execute("VACUUM ANALYZE bench_orders")
        print(
            f"PostgreSQL {version[0] if version else '?'}; {args.rows:,} deadlines over"
            f" {args.days} days\n"
        )
        print(f"{'by':<5} {'count':<9} {'median s':>9} {'min':>7} {'max':>7} {'/ date_bin':>11}")
        for by in ("hour", "day"):
            q = query([plain], rule=None, since=f"{args.days}d", by=by, now=NOW)
            params = {
                "step": q.step,
                "start": q.start,
                "after": plain.after,
                "low": q.start - plain.after,
                "high": q.until - plain.after,
            }

            def ours(r: Rule, by: str = by) -> int:
                wanted = query([r], rule=None, since=f"{args.days}d", by=by, now=NOW)
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    conn.execute("SET LOCAL jit = off")
                    got, note = due_by_period(conn, r, wanted)
                assert got is not None, note
                return sum(got.values())

            def before(params: dict[str, object] = params) -> int:
                # The release before's _due: the catalog, the index check, the count.
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    conn.execute("SET LOCAL jit = off")
                    assert inspect_table(conn, "public", "bench_orders") is not None
                    assert conn.execute(INDEXED).fetchone() == (True,)
                    return sum(n for _, n in conn.execute(DATE_BIN, params).fetchall())

            work = {
                "date_bin": before,
                "cutoffs": lambda: ours(plain),
                "calendar": lambda: ours(cal),
            }
            times: dict[str, list[float]] = {k: [] for k in work}
            for _ in range(max(args.reps, 3)):
                for label, run in work.items():
                    t = time.perf_counter()
                    run()
                    times[label].append(time.perf_counter() - t)
            base = statistics.median(times["date_bin"])
            for label, values in times.items():
                m = statistics.median(values)
                print(
                    f"{by:<5} {label:<9} {m:>9.3f} {min(values):>7.3f} {max(values):>7.3f}"
                    f" {m / base:>10.2f}x"
                )


if __name__ == "__main__":
    main()
