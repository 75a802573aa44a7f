"""One benchmark: slawatch against the seed's SQL, a naive UPDATE and PGQueuer on a shop table.

Builds `orders` (16 columns, primary key + 7 business indexes) with ROWS rows of
which DUE are paid, unshipped and overdue, and prints, in one interleaved run on
the same data: the claim (slawatch inline, slawatch `track: table`, each writing the
outbox in both shapes, SLAWATCH_OUTBOX=alerts and rows (docs/explanation/outbox-rows.md),
the seed article's statement of docs/explanation/claim.md, a naive UPDATE), the empty probe, the 1st vs
10th drain of a long run, WAL and index entries per alert, the HOT ratio, one
batch's EXPLAIN, end-to-end to a webhook receiver (`slawatch run` in a
subprocess, in each shape of the outbox), 1/2/4 claiming processes and the
peer (PGQueuer); then delivery (bench/delivery.py's measure_shapes(): both shapes of
the outbox, interleaved), the idle cost of 100 rules (bench/idle.py's
measure()), the CPU of 100 / 300 / 1,000 idle rules (bench/rules.py's measure()),
the event figures (bench/events.py), the rows and backlog curves (bench/scale.py's
measure(): the claim at 1 / 3 / 10 M rows, drains of 10 k / 100 k / 1 M due) and
retention with 10 M alerts of history (bench/prune.py's measure()); then issue 18's
table and issue 27's, each row as met / NOT met / not measured, with the section that
measures it. Where a figure was measured in both shapes of the outbox, the table's
figure and verdict are the default shape's (DEFAULT_OUTBOX, SLAWATCH_OUTBOX's default),
the other shape's beside it ("; SLAWATCH_OUTBOX=alerts: ..."). Not a test: the
figures depend on the machine.

    .venv/bin/python bench/run.py                                # the record: ~60 minutes (see below)
    .venv/bin/python bench/run.py --markdown                     # the table as docs/performance.md's
    .venv/bin/python bench/run.py --only claim,long              # some rows again
    .venv/bin/python bench/run.py --skip events                  # without the event figures
    .venv/bin/python bench/run.py --rows 5000000 --due 500000    # the scale of docs/performance.md
    .venv/bin/python bench/run.py --only scale --scale-rows 1000000,3000000 --scale-due 10000,100000
    .venv/bin/python bench/run.py --only fire --fire-outbox rows  # firing, the default shape alone
    .venv/bin/python bench/run.py --quick                        # a few minutes: does it run?

Sections (--only / --skip): claim, explain, probe, long, e2e, procs, peer, delivery,
idle, rules, ingest, http, fire, timerprobe, lateness, brokers ("events": these six),
scale, prune. Where the default run's time goes on this 2-core machine: the sections
up to brokers ~15 minutes; scale ~30 minutes (estimated: loading 1 + 3 + 10 M rows,
each curve point on fresh copies, the 1 M backlog drains; bench/scale.py's docstring);
prune ~7-8 minutes (loading 10 M alerts of history: 33 s per million here). Seconds
per section are printed on stderr.

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
Every database it makes is dropped at the end. PGQueuer: pip install -e '.[bench]'.
"""

# ruff: noqa: RUF001, RUF002, RUF003, E501
# (the output prints × and – on purpose; the long lines are SQL and printed rows)

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from pydantic import ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import events
from benchdb import Scratch
from common import machine, med, pct

from slawatch.config.rules import Rule
from slawatch.config.settings import DEFAULT_OUTBOX, Outbox
from slawatch.engine.claim import batches
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.runtime.maintain import BATCH as PRUNE_BATCH
from slawatch.runtime.maintain import prune_batch

RULE = "order_unshipped"
COLUMNS = ["id", "user_id", "total_cents", "email"]  # 4 row columns: a ~360-byte alert
DESCRIPTION = "Paid orders not shipped within 48 hours"

SHOP = """
CREATE TABLE orders (
    id               bigint PRIMARY KEY,
    user_id          bigint NOT NULL,
    email            text NOT NULL,
    status           text NOT NULL,          -- pending | paid | shipped | cancelled
    total_cents      integer NOT NULL,
    currency         char(3) NOT NULL,
    items            integer NOT NULL,
    created_at       timestamptz NOT NULL,
    paid_at          timestamptz,
    shipped_at       timestamptz,
    updated_at       timestamptz NOT NULL,
    shipping_country char(2) NOT NULL,
    shipping_method  text NOT NULL,
    coupon           text,
    payment_ref      text NOT NULL,
    note             text
);
"""
# The shop's own indexes: every non-HOT update of a row writes one entry into each.
SHOP_INDEXES = [
    "CREATE INDEX orders_user_id ON orders (user_id)",
    "CREATE INDEX orders_status ON orders (status)",
    "CREATE INDEX orders_created_at ON orders (created_at)",
    "CREATE INDEX orders_paid_at ON orders (paid_at)",
    "CREATE INDEX orders_updated_at ON orders (updated_at)",
    "CREATE INDEX orders_status_created ON orders (status, created_at)",
    "CREATE INDEX orders_email ON orders (email)",
]
# Orders arrive in id order, so the overdue ones (paid 2-3 days ago, not shipped) sit
# in the newest band of the table: from id `band` on, every step-th row is due (1 in
# 10, the issue's density, where the table allows). 1 in 100 rows is paid but not yet
# due (in the partial indexes, not claimable), 1 in 200 pending, the rest shipped.
# Times follow ids, as they do in a real table.
INSERT_ROWS = """
INSERT INTO orders
SELECT g, u, 'user' || u || '@example.com',
       s, 1000 + mod(g * 7, 90000), 'EUR', 1 + mod(g, 7),
       p - interval '10 minutes', CASE WHEN s <> 'pending' THEN p END,
       CASE WHEN s = 'shipped' THEN p + interval '20 hours' END,
       p + interval '1 hour', 'DE', 'standard', NULL, md5(g::text), NULL
  FROM (SELECT g, mod(g * 7919, 200000) AS u,
               CASE WHEN d THEN 'paid'
                    WHEN mod(g, 100) = 1 THEN 'paid'
                    WHEN mod(g, 200) = 3 THEN 'pending'
                    ELSE 'shipped' END AS s,
               CASE WHEN d THEN DUE_AT
                    WHEN mod(g, 100) = 1 THEN %(now)s::timestamptz - interval '1 hour'
                    ELSE %(now)s::timestamptz - interval '5 days' - (%(top)s - g) * interval '1 second'
               END AS p
          FROM (SELECT g, g >= %(band)s::bigint AND mod(g, %(step)s::bigint) = 0 AS d
                  FROM generate_series(%(first)s::bigint, %(last)s::bigint) g) gs) x
"""
# Overdue by 1 h and more, newer orders paid later.
DUE_AT = "%(now)s::timestamptz - interval '49 hours' - (%(top)s - g) * interval '250 milliseconds'"

# The seed article's statement (docs/explanation/claim.md), word for word but for names:
# two columns, two partial indexes, no outbox.
RAW_SETUP = """
ALTER TABLE orders ADD COLUMN sw_raw_n int NOT NULL DEFAULT 0,
                   ADD COLUMN sw_raw_next timestamptz;
CREATE INDEX sw_raw_first ON orders (paid_at) WHERE sw_raw_n = 0 AND (status = 'paid');
CREATE INDEX sw_raw_again ON orders (sw_raw_next)
       WHERE sw_raw_next IS NOT NULL AND (status = 'paid');
"""
RAW = """
UPDATE orders SET sw_raw_n = sw_raw_n + 1,
                  sw_raw_next = CASE WHEN sw_raw_n + 1 >= 5 THEN NULL
                                     ELSE %(now)s::timestamptz + interval '6 hours' END
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM orders WHERE paid_at < %(now)s::timestamptz - interval '48 hours'
                              AND sw_raw_n = 0 AND (status = 'paid')
    UNION ALL
    SELECT ctid FROM orders WHERE sw_raw_next < %(now)s::timestamptz
                              AND sw_raw_next IS NOT NULL AND (status = 'paid')
    LIMIT %(batch)s::int))
RETURNING id, user_id, total_cents, email, paid_at"""
# The naive way: a flag and the shop's ordinary index on the deadline (orders_paid_at).
NAIVE_SETUP = "ALTER TABLE orders ADD COLUMN notified boolean NOT NULL DEFAULT false"
NAIVE = """
UPDATE orders SET notified = true
 WHERE id IN (SELECT id FROM orders
               WHERE paid_at < %(now)s::timestamptz - interval '48 hours'
                 AND status = 'paid' AND notified = false
               LIMIT %(batch)s::int)
RETURNING id, user_id, total_cents, email, paid_at"""


def rule_dict(batch: int, track: str | None = None, every: str = "30s") -> dict[str, Any]:
    rule: dict[str, Any] = {
        "name": RULE,
        "description": DESCRIPTION,
        "table": "public.orders",
        "deadline": "paid_at",
        "after": "48h",
        "open_when": "status = 'paid'",
        "every": every,
        "batch": batch,
        "renotify": {"every": "6h", "max": 5},
        "columns": COLUMNS,
        "notify": ["ops-webhook"],
    }
    if track is not None:
        rule["track"] = track
    return rule


def table_track_status() -> str | None:
    """None when this slawatch accepts ``track: table``; else why it is skipped."""
    try:
        Rule.model_validate(rule_dict(1000, "table"))
    except ValidationError:
        return "not built"
    return None


# ---------------------------------------------------------------- helpers


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server process ``pid`` has used, from /proc; NaN
    where it cannot be read (a server elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_round(
    runs: list[dict[str, float]], base: list[dict[str, float]], key: str = "rate"
) -> float:
    """The median of each round's ratio of ``key`` (rows/s), ``runs`` to ``base`` (runs of
    two variants, round by round: the same load on both)."""
    return med([a[key] / b[key] for a, b in zip(runs, base, strict=True) if b[key]])


def spread(xs: list[float], fmt: str = ",.0f") -> str:
    """median (min–max)"""
    if not xs:
        return "-"
    return f"{med(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"


def lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def table_stats(conn: psycopg.Connection[Any], table: str = "orders") -> tuple[int, int]:
    """(n_tup_upd, n_tup_hot_upd) of ``table``, with this backend's counters flushed."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # flushed as this backend goes idle
    time.sleep(0.05)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s", (table,)
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def rel_sizes(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(heap bytes, business-index bytes) of orders."""
    row = conn.execute(
        "SELECT pg_relation_size('orders'),"
        " (SELECT sum(pg_relation_size(indexrelid)) FROM pg_index i JOIN pg_class c"
        "   ON c.oid = i.indexrelid WHERE indrelid = 'orders'::regclass"
        "   AND c.relname NOT LIKE 'sw\\_%%')"
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def prewarm(conn: psycopg.Connection[Any]) -> None:
    """Same cache state for every variant: the table and its indexes read once, a checkpoint
    (so every variant pays the same full-page images after it)."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
    conn.execute(
        "SELECT pg_prewarm(c.oid) FROM pg_class c WHERE c.oid = 'orders'::regclass"
        " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'orders'::regclass)"
    )
    conn.execute("CHECKPOINT")


# ---------------------------------------------------------------- building the data


def load_shop(dsn: str, rows: int, due: int, now: datetime) -> float:
    t = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SHOP)
        step = max(min(10, rows // max(due, 1)), 2)
        band = max(rows - due * step + 1, 1)
        chunk = 1_000_000
        for first in range(1, rows + 1, chunk):
            conn.execute(
                INSERT_ROWS.replace("DUE_AT", DUE_AT),
                {
                    "step": step,
                    "band": band,
                    "top": rows,
                    "now": now,
                    "first": first,
                    "last": min(first + chunk - 1, rows),
                },
            )
        for stmt in SHOP_INDEXES:
            conn.execute(stmt)
        conn.execute("VACUUM ANALYZE orders")
    return time.perf_counter() - t


# A long run's fresh work: paid orders that fell due during the last minute (since the
# previous drain), as in a shop where time passes. (Rows due long before they were
# written are backfills: the `table` sweep's work, not a scan's.)
FRESH_DUE_AT = (
    "%(now)s::timestamptz - interval '48 hours'"
    " - (%(top)s - g + 1) * (interval '60 seconds' / %(count)s::integer)"
)


def add_due(conn: psycopg.Connection[Any], first_id: int, count: int, now: datetime) -> None:
    """``count`` new orders, paid and fallen due during the minute before ``now``."""
    conn.execute(
        INSERT_ROWS.replace("DUE_AT", FRESH_DUE_AT),
        {
            "count": count,
            "step": 1,
            "band": 0,
            "top": first_id + count - 1,
            "now": now,
            "first": first_id,
            "last": first_id + count - 1,
        },
    )


# ---------------------------------------------------------------- the variants


@dataclass
class Variant:
    name: str
    label: str
    skipped: str | None = None
    setup: Callable[[psycopg.Connection[Any], int], None] | None = None
    # (conn, batch, now) -> a step function returning rows claimed
    stepper: Callable[[psycopg.Connection[Any], int, datetime], Callable[[], int]] | None = None
    explain: (
        Callable[[psycopg.Connection[Any], int, datetime], tuple[sql.Composable, Any]] | None
    ) = None
    runs: list[dict[str, float]] = field(default_factory=list)


def slawatch_variant(track: str | None, outbox: Outbox = "alerts") -> Variant:
    """slawatch's claim of the rule, ``track`` inline or table, writing the outbox in
    the shape ``outbox`` (SLAWATCH_OUTBOX; "rows": named ``<track>_rows``,
    docs/explanation/outbox-rows.md; labeled with its shape)."""
    name = "table" if track == "table" else "inline"
    skipped = table_track_status() if track == "table" else None

    def rule(batch: int) -> Rule:
        return Rule.model_validate(rule_dict(batch, track))

    def setup(conn: psycopg.Connection[Any], batch: int) -> None:
        migrate(conn, [rule(batch)])

    def stepper(conn: psycopg.Connection[Any], batch: int, now: datetime) -> Callable[[], int]:
        plan = prepare(conn, rule(batch), outbox=outbox)
        return batches(conn, plan, now)

    def explain(conn: psycopg.Connection[Any], batch: int, now: datetime) -> Any:
        plan = prepare(conn, rule(batch), outbox=outbox)
        if plan.table is not None:  # the first batch of a first drain: from the beginning
            return plan.table.claim, plan.params(now) | {"since": "-infinity"}
        return plan.statement, plan.params(now)

    label = f"slawatch track: {name}, claim + outbox in {outbox}"
    if outbox == "rows":
        name = f"{name}_rows"
    return Variant(name, label, skipped, setup, stepper, explain)


def sql_variant(name: str, label: str, setup_sql: str, claim: str) -> Variant:
    def setup(conn: psycopg.Connection[Any], batch: int) -> None:
        conn.execute(setup_sql)

    def stepper(conn: psycopg.Connection[Any], batch: int, now: datetime) -> Callable[[], int]:
        params = {"now": now, "batch": batch}
        # Prepared, planned for its parameters every time: the statement at its best.
        # (After 5 runs PostgreSQL's default switches the seed's statement to a generic
        # plan that reads the whole table; the probe measures that too.)
        conn.execute("SET plan_cache_mode = force_custom_plan")

        def step() -> int:
            return len(conn.execute(claim, params, prepare=True).fetchall())

        return step

    def explain(conn: psycopg.Connection[Any], batch: int, now: datetime) -> Any:
        return sql.SQL(claim), {"now": now, "batch": batch}

    return Variant(name, label, None, setup, stepper, explain)


def shaped(name: str, outbox: Outbox) -> str:
    """The variant of slawatch's claim ``name`` (inline, table) writing the outbox in
    ``outbox`` (slawatch_variant's names)."""
    return f"{name}_rows" if outbox == "rows" else name


def variants() -> list[Variant]:
    return [
        slawatch_variant(None),
        slawatch_variant("table"),
        # SLAWATCH_OUTBOX=rows (the default): the same claim writing the outbox in rows of
        # up to 100 alerts (docs/explanation/outbox-rows.md), beside alerts in every round.
        slawatch_variant(None, "rows"),
        slawatch_variant("table", "rows"),
        sql_variant("raw", "seed's raw claim (§1), no outbox", RAW_SETUP, RAW),
        sql_variant("naive", "naive UPDATE, flag + deadline index", NAIVE_SETUP, NAIVE),
    ]


# ---------------------------------------------------------------- measuring one drain


def drain(step: Callable[[], int], batch: int, budget: float) -> tuple[int, list[float], float]:
    """Claim until a short batch (or ``budget`` seconds): rows, seconds per batch, total."""
    total, times = 0, []
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter()
        got = step()
        times.append(time.perf_counter() - t)
        total += got
        if got < batch or time.perf_counter() - t0 > budget:
            return total, times, time.perf_counter() - t0


def quiet_clock(conn: psycopg.Connection[Any]) -> datetime:
    """A clock an hour before the earliest deadline of the table: nothing is due then."""
    row = conn.execute(
        "SELECT min(paid_at) + interval '47 hours' FROM orders WHERE status = 'paid'"
    ).fetchone()
    assert row and row[0] is not None
    return row[0]  # type: ignore[no-any-return]


def measure_drain(
    dsn: str, v: Variant, batch: int, now: datetime, budget: float
) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        prewarm(conn)
        # The empty probe first, on the clean copy, at a clock before every deadline: nothing
        # is due then, the partial indexes hold every open row (no dead entries from a drain).
        quiet = quiet_clock(conn)
        probes = []
        if v.name != "naive":  # its "probe" reads every old order: not a probe
            empty = v.stepper(conn, batch, quiet)  # type: ignore[misc]
            for _ in range(20):  # warm: plans cached where the variant caches them
                empty()
            for _ in range(200):
                t = time.perf_counter()
                empty()
                probes.append((time.perf_counter() - t) * 1e6)
        unprepared = []
        if v.name in ("inline", "table"):
            # SLAWATCH_POOLER=transaction, and auto through a pooler or proxy: no prepared
            # statements; the column above is SLAWATCH_POOLER=none/session, and auto on a
            # connection proven direct (psycopg prepares after 5 runs).
            conn.prepare_threshold = None
            empty = v.stepper(conn, batch, quiet)  # type: ignore[misc]
            for _ in range(20):
                empty()
            for _ in range(100):
                t = time.perf_counter()
                empty()
                unprepared.append((time.perf_counter() - t) * 1e6)
            conn.prepare_threshold = 5
        auto = []
        if v.name == "raw":
            empty = v.stepper(conn, batch, quiet)  # type: ignore[misc]
            conn.execute("DEALLOCATE ALL")
            conn.execute("SET plan_cache_mode = auto")
            for _ in range(20):
                empty()
            for _ in range(50):
                t = time.perf_counter()
                empty()
                auto.append((time.perf_counter() - t) * 1e6)
            conn.execute("DEALLOCATE ALL")
        step = v.stepper(conn, batch, now)  # type: ignore[misc]
        upd0, hot0 = table_stats(conn)
        heap0, idx0 = rel_sizes(conn)
        wal0 = lsn(conn)
        cpu0 = backend_cpu(conn.info.backend_pid)
        total, times, secs = drain(step, batch, budget)
        cpu1 = backend_cpu(conn.info.backend_pid)
        wal = lsn(conn) - wal0
        upd, hot = table_stats(conn)
        heap1, idx1 = rel_sizes(conn)
    return {
        "rows": total,
        "secs": secs,
        "rate": total / secs if secs else 0,
        "ms_batch": med(times) * 1000,
        "wal_per": wal / total if total else float("nan"),
        # The drain's server CPU per alert, µs (its backend's, from /proc: NaN when the
        # server is not a process of this machine). Steadier than rows/s on a shared machine.
        "cpu_per": (cpu1 - cpu0) / total * 1e6 if total and cpu0 == cpu0 else float("nan"),
        "upd": upd - upd0,
        "hot": hot - hot0,
        "heap_mb": (heap1 - heap0) / 1e6,
        "idx_mb": (idx1 - idx0) / 1e6,
        "probe_us": med(probes) if probes else float("nan"),
        "probe_auto_us": med(auto) if auto else float("nan"),
        "probe_unprepared_us": med(unprepared) if unprepared else float("nan"),
        "budget_hit": float(secs >= budget),
    }


# ---------------------------------------------------------------- one batch, looked into


def walk(plan: dict[str, Any], out: list[dict[str, Any]]) -> None:
    out.append(plan)
    for child in plan.get("Plans", []):
        walk(child, out)


def explain_batch(dsn: str, v: Variant, batch: int, now: datetime) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of one batch, and the WAL it wrote, by relation."""
    lines = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        prewarm(conn)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        # Keeps the batch's WAL until read: a checkpoint may otherwise recycle it.
        conn.execute(
            "SELECT pg_create_physical_replication_slot('slawatch_bench_' ||"
            " pg_backend_pid(), true, true)"
        )
        stmt, params = v.explain(conn, batch, now)  # type: ignore[misc]
        w0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        with conn.transaction():
            res = conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) ") + stmt, params
            ).fetchone()
        w1 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        doc = res[0][0] if res else {}
        top = doc["Plan"]
        nodes: list[dict[str, Any]] = []
        walk(top, nodes)
        total_ms = doc.get("Execution Time", 0.0)
        rows = 0
        lines.append(
            f"  {v.name}: execution {total_ms:,.0f} ms, planning {doc.get('Planning Time', 0):.1f} ms;"
            f" WAL {top.get('WAL Bytes', 0) / 1e6:,.1f} MB, {top.get('WAL FPI', 0):,} full-page images"
        )
        for node in nodes:
            if node.get("Node Type") == "ModifyTable":
                rows = max(rows, int(node.get("Actual Rows", 0)))
                lines.append(
                    f"    {node.get('Operation', '?'):<7} {node.get('Relation Name', '?'):<10}"
                    f" {node.get('Actual Rows', 0):>7,} rows {node.get('Actual Total Time', 0):>8,.0f} ms"
                    f" ({node.get('Actual Total Time', 0) / total_ms * 100 if total_ms else 0:>3.0f} %),"
                    f" WAL {node.get('WAL Bytes', 0) / 1e6:>6.1f} MB,"
                    f" FPI {node.get('WAL FPI', 0):>6,}"
                )
        # Who wrote which WAL records: index entries per relation, full-page image share.
        recs = conn.execute(
            "SELECT resource_manager, record_type, record_length, fpi_length, block_ref"
            " FROM pg_get_wal_records_info(%s, %s)",
            (w0, w1),
        ).fetchall()
        dboid = conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()[0]  # type: ignore[index]
        names = dict(
            conn.execute(
                "SELECT pg_relation_filenode(oid)::bigint, relname FROM pg_class"
                " WHERE pg_relation_filenode(oid) IS NOT NULL"
            ).fetchall()
        )
        entries: Counter[str] = Counter()
        fpi = total = 0
        for rm, rtype, length, fpi_len, ref in recs:
            # WAL is the server's: keep this database's records (and commits, which name none).
            m = re.search(r"rel \d+/(\d+)/(\d+)", ref or "")
            if m and int(m.group(1)) != dboid:
                continue
            total += length
            fpi += fpi_len or 0
            if (
                m
                and rm == "Btree"
                and rtype in ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")
            ):
                entries[names.get(int(m.group(2)), "other")] += 1
        alerts = rows or 1
        shop = sum(c for r, c in entries.items() if r.startswith("orders"))
        ours = sum(c for r, c in entries.items() if not r.startswith("orders"))
        lines.append(
            f"    WAL {total / alerts:,.0f} B/alert ({fpi / total * 100 if total else 0:.0f} % full-page"
            f" images); index entries/alert: shop's {shop / alerts:.1f}, slawatch's/tracking"
            f" {ours / alerts:.1f}"
            f" ({', '.join(f'{k} {c / alerts:.1f}' for k, c in sorted(entries.items()) if c / alerts >= 0.05)})"
        )
    return lines


# ---------------------------------------------------------------- 1st vs 10th drain


def long_run(
    dsn: str,
    v: Variant,
    batch: int,
    now: datetime,
    per_drain: int,
    rows: int,
    sweeps: list[float],
) -> list[float]:
    """Ten drains, each of ``per_drain`` fresh overdue orders; rows/s of each.
    ``track: table``: the time of one sweep after them is appended to ``sweeps`` (ms)."""
    rates = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A clock before the table's own deadlines: only the fresh rows are due.
        start = quiet_clock(conn) - timedelta(minutes=15)
        prewarm(conn)
        next_id = rows + 1
        for k in range(10):
            at = start + timedelta(minutes=k + 1)
            add_due(conn, next_id, per_drain, at)
            next_id += per_drain
            conn.execute("ANALYZE orders")
            if v.name in ("inline", "table"):
                # What the delivery workers would have done meanwhile.
                conn.execute(
                    "UPDATE slawatch.delivery SET status = 'sent' WHERE status = 'pending'"
                )
                # Retention running: the pruning job keeps two drains of history (the
                # bench clock moves a minute per drain), and autovacuum makes the space
                # it freed reusable (run here, as it would between drains in minutes).
                while prune_batch(conn, at - timedelta(minutes=2)).alerts >= PRUNE_BATCH:
                    pass
                conn.execute("VACUUM slawatch.alert, slawatch.delivery")
                if v.name == "inline":
                    # An inline claim leaves a dead version of every row it claims; the
                    # the advice of docs/explanation/tracking.md for the watched table (autovacuum_vacuum_scale_factor
                    # = 0.01: a vacuum per ~10,000 dead rows on 1 M) has autovacuum clean
                    # them between drains a minute apart. Without it: 0.69 at drain 10.
                    conn.execute("VACUUM orders")
            conn.execute("CHECKPOINT")
            step = v.stepper(conn, batch, at)  # type: ignore[misc]
            total, _, secs = drain(step, batch, 1e9)
            rates.append(total / secs if secs else 0)
        if v.name == "table":
            # What the periodic sweep (every `sweep`, 10m) costs at the end of the run:
            # every open episode checked, the whole due index read once.
            conn.execute("UPDATE slawatch.watermark SET swept_at = NULL")
            t = time.perf_counter()
            step = v.stepper(conn, batch, at)  # type: ignore[misc]
            drain(step, batch, 1e9)
            sweeps.append((time.perf_counter() - t) * 1000)
    return rates


# ---------------------------------------------------------------- 1 / 2 / 4 processes


def _claimer(dsn: str, batch: int, now: datetime, start: Any, out: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = prepare(conn, Rule.model_validate(rule_dict(batch)))
        out.put(("ready", 0.0))
        start.wait()
        total = 0
        step = batches(conn, plan, now)
        while True:
            got = step()
            total += got
            if got == 0:
                break
        out.put((total, time.perf_counter()))


def processes(dsn: str, n: int, batch: int, now: datetime) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        prewarm(conn)
    ctx = mp.get_context("fork")  # no re-import per process; each opens its own connection
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(dsn, batch, now, start, out)) for _ in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        out.get(timeout=120)  # each connected and planned
    t0 = time.perf_counter()
    start.set()
    results = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    total = sum(r[0] for r in results)
    return total / (max(r[1] for r in results) - t0)


# ---------------------------------------------------------------- a webhook receiver


class Receiver:
    """A real HTTP server in a thread: records when each alert arrived."""

    def __init__(self) -> None:
        self.arrived: dict[str, tuple[float, dict[str, Any]]] = {}
        self.bodies: list[bytes] = []
        self.count = 0
        self.lock = threading.Lock()
        me = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                now = time.time()
                alerts = json.loads(body).get("alerts", [])
                with me.lock:
                    for a in alerts:
                        me.arrived.setdefault(a.get("id", str(me.count)), (now, a))
                        me.count += 1
                    if len(me.bodies) < 2000:
                        me.bodies.append(body)
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if self.count >= n:
                return True
            time.sleep(0.02)
        return False

    def reset(self) -> None:
        with self.lock:
            self.arrived, self.count = {}, 0


def _post_straight(url: str, bodies: list[bytes], alerts: int, out: Any) -> None:
    import httpx

    with httpx.Client() as client:
        t0 = time.perf_counter()
        for b in bodies:
            client.post(url, content=b, headers={"content-type": "application/json"})
        out.put(alerts / (time.perf_counter() - t0))


def post_straight(url: str, bodies: list[bytes], per_body: int) -> float:
    """The same POSTs, sent from another process with no database: the transport's limit."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_post_straight, args=(url, bodies, len(bodies) * per_body, out))
    p.start()
    rate = out.get(timeout=300)
    p.join()
    return float(rate)


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def end_to_end(
    dsn: str,
    due: int,
    batch: int,
    steady_rate: int,
    steady_secs: int,
    rows: int,
    outbox: Outbox = "alerts",
) -> dict[str, float]:
    """`slawatch run` in a subprocess: a burst of ``due`` alerts, then rows falling due at
    ``steady_rate``/s for ``steady_secs``; the receiver is in this process. ``outbox``:
    SLAWATCH_OUTBOX for the run (docs/explanation/outbox-rows.md)."""
    receiver = Receiver()
    res: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        rules, notifiers = Path(tmp, "rules"), Path(tmp, "notifiers")
        rules.mkdir()
        notifiers.mkdir()
        (rules / f"{RULE}.yaml").write_text(json.dumps(rule_dict(batch, every="1s")))
        (notifiers / "ops-webhook.yaml").write_text(
            json.dumps(
                {"name": "ops-webhook", "type": "webhook", "url": receiver.url, "batch": 100}
            )
        )
        env = dict(
            os.environ,
            SLAWATCH_DSN=dsn,
            SLAWATCH_LOG_LEVEL="WARNING",
            SLAWATCH_HTTP="",
            SLAWATCH_OUTBOX=outbox,
        )
        exe = Path(sys.executable).with_name("slawatch")
        cmd = [str(exe), "--rules", str(rules), "--notifiers", str(notifiers), "run"]
        log = Path(tmp, "run.log").open("w+")  # noqa: SIM115
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            ok = receiver.wait(due, 120 + due / 1000)
            with receiver.lock:
                got = dict(receiver.arrived)
            if not ok or not got:
                log.seek(0)
                raise RuntimeError(
                    f"slawatch run delivered {len(got)} of {due}: {log.read()[-2000:]}"
                )
            first_fired = min(ts(a["fired_at"]) for _, a in got.values())
            last = max(t for t, _ in got.values())
            res["e2e_rate"] = len(got) / (last - first_fired)
            res["alert_bytes"] = med(
                [len(json.dumps(a, separators=(",", ":"))) for _, a in got.values()][:1000]
            )
            bodies = list(receiver.bodies)
            per_body = len(json.loads(bodies[0])["alerts"])
            res["per_post"] = per_body
            # Steady: rows falling due at steady_rate/s, starting 3 s from now.
            receiver.reset()
            n = steady_rate * steady_secs
            start = datetime.now(UTC) + timedelta(seconds=3)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    INSERT_ROWS.replace(
                        "DUE_AT",
                        "%(start)s::timestamptz - interval '48 hours'"
                        " + (g - %(first)s::bigint) * %(gap)s::interval",
                    ),
                    {
                        "step": 1,
                        "band": 0,
                        "top": rows + 10_000_000 + n - 1,
                        "now": start,
                        "start": start,
                        "first": rows + 10_000_000,
                        "last": rows + 10_000_000 + n - 1,
                        "gap": timedelta(seconds=1 / steady_rate),
                    },
                )
            receiver.wait(n, steady_secs + 60)
            with receiver.lock:
                got = dict(receiver.arrived)
            lat = [(t - ts(a["fired_at"])) * 1000 for t, a in got.values()]
            due_lat = [(t - ts(a["due_at"])) * 1000 for t, a in got.values()]
            res["steady_n"], res["steady_expected"] = len(got), n
            res["claim_p50"], res["claim_p99"] = med(lat), pct(lat, 0.99)
            res["due_p50"], res["due_p99"] = med(due_lat), pct(due_lat, 0.99)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    res["raw_post_rate"] = post_straight(receiver.url, bodies, per_body)
    receiver.server.shutdown()
    return res


# ---------------------------------------------------------------- the peer: PGQueuer

PEER_SETUP = """
CREATE TABLE peer_alert (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                         order_id bigint NOT NULL, fired_at timestamptz NOT NULL,
                         row_data jsonb NOT NULL)
"""
# The handler's work: is the order still paid? then an alert row (one statement).
PEER_ALERT = """
INSERT INTO peer_alert (order_id, fired_at, row_data)
SELECT id, clock_timestamp(), jsonb_build_object('id', id, 'user_id', user_id,
                                     'total_cents', total_cents, 'email', email)
  FROM orders WHERE id = $1 AND status = 'paid'
RETURNING order_id, fired_at, row_data"""


def asyncpg_args(dsn: str) -> dict[str, Any]:
    """asyncpg.connect keyword arguments from a libpq conninfo string."""
    info = conninfo_to_dict(dsn)
    keep = {"host", "port", "user", "password", "dbname"}
    args = {("database" if k == "dbname" else k): v for k, v in info.items() if k in keep}
    if "port" in args:
        args["port"] = int(args["port"])
    return args


async def _peer(dsn: str, ids: list[int], post_url: str | None, batch: int) -> dict[str, float]:
    import asyncpg
    import httpx
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(**asyncpg_args(dsn))
    pool = await asyncpg.create_pool(**asyncpg_args(dsn), min_size=4, max_size=4)
    client = httpx.AsyncClient() if post_url else None
    queries = Queries(AsyncpgDriver(conn))
    # One job per deadline: enqueued when the order was paid, due 48 h later.
    enq_wal0 = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    for i in range(0, len(ids), 5000):
        chunk = ids[i : i + 5000]
        await queries.enqueue(
            ["order_deadline"] * len(chunk),
            [str(x).encode() for x in chunk],
            [0] * len(chunk),
            [timedelta(0)] * len(chunk),
        )
    enq_wal = float(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn") - enq_wal0)
    qm = QueueManager(queries)
    alerted = 0

    @qm.entrypoint("order_deadline")
    async def order_deadline(job: Job) -> None:
        nonlocal alerted
        async with pool.acquire() as c:
            row = await c.fetchrow(PEER_ALERT, int(job.payload or b"0"))
        if row is not None:
            alerted += 1
            if client is not None:
                alert = {
                    "id": f"{RULE}:{row['order_id']}:e1:n1",
                    "rule": RULE,
                    "key": str(row["order_id"]),
                    "n": 1,
                    "severity": "warning",
                    "fired_at": row["fired_at"].isoformat(),
                    "row": json.loads(row["row_data"]),
                    "description": DESCRIPTION,
                }
                await client.post(post_url, json={"alerts": [alert]})

    wal0 = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    t0 = time.perf_counter()
    await qm.run(
        batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1)
    )
    secs = time.perf_counter() - t0
    wal = float(await pool.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn") - wal0)
    # The rate while working: first to last alert (excludes the worker's start and its
    # drain-mode idle wait at the end, which a long-running worker would not pay).
    span = await pool.fetchval(
        "SELECT extract(epoch FROM max(fired_at) - min(fired_at)) FROM peer_alert"
    )
    if client is not None:
        await client.aclose()
    await pool.close()
    if not conn.is_closed():
        await conn.close()
    span = float(span or 0)
    return {
        "rate": alerted / span if span else 0,
        "alerts": alerted,
        "wall": secs,
        "wal_per": wal / alerted if alerted else float("nan"),
        "enq_wal_per": enq_wal / len(ids) if ids else float("nan"),
    }


def peer(dsn: str, due_ids: list[int], batch: int, receiver_url: str | None) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PEER_SETUP)
        prewarm(conn)
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def install() -> None:
        import asyncpg

        c = await asyncpg.connect(**asyncpg_args(dsn))
        await Queries(AsyncpgDriver(c)).install()
        await c.close()

    asyncio.run(install())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    # In its own process, like slawatch run: the receiver here does not share its GIL.
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_peer_process, args=(dsn, due_ids, receiver_url, batch, out))
    p.start()
    res = out.get(timeout=1800)
    p.join()
    return dict(res)


def _peer_process(dsn: str, ids: list[int], url: str | None, batch: int, out: Any) -> None:
    out.put(asyncio.run(_peer(dsn, ids, url, batch)))


def pgqueuer_status() -> str | None:
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError:
        return "not installed (pip install -e '.[bench]')"
    return None


# ---------------------------------------------------------------- the run


# Every section, in the order it runs; --skip / --only take these names ("events" stands
# for its six). Each row of the table names the section that measures it.
SECTIONS = (
    "claim", "explain", "probe", "long", "e2e", "procs", "peer",
    "delivery", "idle", "rules", "ingest", "http", "fire", "timerprobe", "lateness", "brokers",
    "scale", "prune",
)  # fmt: skip
SHOP_SECTIONS = {"claim", "explain", "long", "e2e", "procs", "peer"}  # need the shop table
EVENT_SECTIONS = ("ingest", "http", "fire", "timerprobe", "lateness", "brokers")  # events.py's


def sections(names: str) -> set[str]:
    """The set a comma-separated --skip/--only names; an unknown name is an error."""
    out: set[str] = set()
    for name in (n.strip() for n in names.split(",")):
        if name == "events":
            out |= set(EVENT_SECTIONS)
        elif name in SECTIONS:
            out.add(name)
        elif name:
            raise SystemExit(f"unknown section {name!r}: one of {', '.join(SECTIONS)}, events")
    return out


@dataclass
class Row:
    """One row of the issue's table: a figure, what this run measured, the goal, met or
    not (None: not measured or no goal), and the sections that measure it."""

    figure: str
    now: str
    goal: str
    met: bool | None
    section: str
    value: float | None = None  # the figure as a number, for issue 27's table
    outbox: str = DEFAULT_OUTBOX  # SLAWATCH_OUTBOX the figure was measured with

    @property
    def mark(self) -> str:
        return {True: "met", False: "NOT met", None: "-"}[self.met]

    def command(self) -> str:
        return f"bench/run.py --only {self.section}"


@dataclass(frozen=True)
class Goal:
    """A row of issue 27's table: the figure (``key`` in the run's figures), its goal
    (at least or at most ``limit``), and the sections that measure it."""

    key: str
    figure: str
    limit: float
    at_most: bool
    section: str
    unit: str = "×"

    @property
    def goal(self) -> str:
        sign = "≤" if self.at_most else "≥"
        if self.unit == "%":
            return f"{sign} {self.limit * 100:.0f} %"
        return f"{sign} {self.limit:g}{self.unit}"

    def met(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit


ISSUE_27 = (
    Goal("table", "`track: table` claim + outbox vs the seed's raw claim", 2.5, False, "claim"),
    Goal("inline", "`track: inline` claim + outbox vs raw", 0.95, False, "claim"),
    Goal(
        "e2e",
        "end to end (`slawatch run`, a burst: first claim to last receipt at a local"
        " webhook) vs the raw claim alone",
        0.75,
        False,
        "claim,e2e",
    ),
    Goal("delivery", "delivery vs straight POSTs of the same bodies", 0.5, False, "delivery"),
    Goal("wal", "WAL per alert vs PGQueuer", 0.2, True, "claim,peer"),
    Goal(
        "prune",
        "retention with 10 M alerts of history: pruning a drain's worth vs the drain",
        0.10,
        True,
        "prune",
        "%",
    ),
    Goal("idle", "idle DB time, 100 rules, vs the raw probes", 1.2, True, "idle"),
    Goal(
        "idle_pooler",
        "the same behind a transaction pooler (SLAWATCH_POOLER=transaction)",
        1.5,
        True,
        "idle",
    ),
    Goal(
        "event", "`slawatch.event()` pipelined vs raw `INSERT … ON CONFLICT`", 0.7, False, "ingest"
    ),
    Goal("fire", "firing due timers vs the raw statement", 0.9, False, "fire"),
    Goal("timer_bytes", "bytes per open timer", 250, True, "lateness", " B"),
    Goal(
        "rules_cpu",
        "many idle rules (`every: 5s`): slawatch's own CPU vs the database's, at the most rules",
        1.0,
        True,
        "rules",
    ),
    Goal(
        "rules_bend",
        "the rules curve: slawatch's CPU per rule at the most rules vs the fewest (linear: 1)",
        1.5,
        True,
        "rules",
    ),
    Goal(
        "rows_curve",
        "rows curve: claim rows/s at the most rows vs the fewest (flat: 1; bends below 1/1.5)",
        0.67,
        False,
        "scale",
    ),
    Goal(
        "backlog_curve",
        "backlog curve: drain rows/s at the biggest backlog vs the smallest (linear time: 1)",
        0.67,
        False,
        "scale",
    ),
)


def issue27_rows(figures: dict[str, tuple[float, str]], why: dict[str, str]) -> list[Row]:
    """Issue 27's table: each goal beside its figure (``figures[key]``: the number and
    how it was measured), or not measured (``why[key]``, else skipped)."""
    rows = []
    for g in ISSUE_27:
        got = figures.get(g.key)
        if got is None:
            reason = why.get(g.key, "skipped")
            rows.append(not_measured(g.figure, g.goal, g.section, reason))
            continue
        value, detail = got
        rows.append(Row(g.figure, detail, g.goal, g.met(value), g.section, value))
    return rows


# The shape of the outbox the tables put beside the default's (DEFAULT_OUTBOX).
OTHER_OUTBOX: Outbox = next(o for o in events.OUTBOXES if o != DEFAULT_OUTBOX)


def beside(headline: str, other: str | None) -> str:
    """A figure measured in both shapes of the outbox, as the tables print it: the
    default shape's (``headline``, whose number gives the verdict), then the other
    shape's (``other``, if measured) beside it."""
    return f"{headline}; SLAWATCH_OUTBOX={OTHER_OUTBOX}: {other}" if other else headline


def event_figure(rows: list[Row], *words: str, but: str = "") -> tuple[float, str] | None:
    """The number leading the ``measured`` text of bench/events.py's row whose figure
    has all of ``words`` and not ``but`` (its text may change on another branch: None
    if not found)."""
    for r in rows:
        if but and but.lower() in r.figure.lower():
            continue
        if all(w.lower() in r.figure.lower() for w in words):
            found = re.match(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)", r.now)
            if found:
                return float(found.group(1).replace(",", "")), r.now
    return None


def not_measured(figure: str, goal: str, section: str, why: str) -> Row:
    return Row(figure, f"not measured ({why})", goal, None, section)


def guarded(module: str, function: str) -> Callable[..., Any] | None:
    """``module.function`` from bench/ if it is there (another branch brings it), else None."""
    try:
        mod = __import__(module)
    except ImportError:
        return None
    fn = getattr(mod, function, None)
    return fn if callable(fn) else None


def attempt(measure: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, str]:
    """(``measure(...)``, "") or, when it raises, (None, why) with the traceback on
    stderr: another branch's code failing is a row that says so, not the run's end."""
    try:
        return measure(*args, **kwargs), ""
    except Exception as exc:
        traceback.print_exc()
        return None, f"failed: {exc!r}"[:200]


def delivery_rows(quick: bool) -> list[Row]:
    """bench/delivery.py's measure(): slawatch's webhook delivery vs straight POSTs; with
    its measure_shapes(), both shapes of the outbox interleaved by round, the default
    shape's (DEFAULT_OUTBOX) first, the other's a row of its own, labeled
    (docs/explanation/outbox-rows.md)."""
    figure = "delivery, 20 k alerts to a fast local receiver, webhook batch 100 × 4"
    if quick:
        figure = figure.replace("20 k", "2 k")
    goal = "≥ 0.5× straight POSTs"
    other_figure = f"{figure}, outbox in {OTHER_OUTBOX} (SLAWATCH_OUTBOX={OTHER_OUTBOX})"
    alerts, rounds = (2_000, 1) if quick else (20_000, 3)
    shapes = guarded("delivery", "measure_shapes")
    measure = guarded("delivery", "measure")
    if shapes is not None:
        res, failed = attempt(
            shapes, None, alerts=alerts, rounds=rounds, outboxes=(DEFAULT_OUTBOX, OTHER_OUTBOX)
        )
        if res is None:
            return [
                not_measured(figure, goal, "delivery", failed),
                Row(
                    other_figure,
                    f"not measured ({failed})",
                    goal,
                    None,
                    "delivery",
                    None,
                    OTHER_OUTBOX,
                ),
            ]
    elif measure is not None:
        one, failed = attempt(measure, None, alerts=alerts, rounds=rounds)
        if one is None:
            return [not_measured(figure, goal, "delivery", failed)]
        res = {"alerts": one}  # measure()'s own shape (its default)
    else:
        return [not_measured(figure, goal, "delivery", "needs bench/delivery.py measure()")]
    out = []
    for outbox, got in res.items():
        x = float(got["ratio"])
        cpu = (
            f" ({got['slawatch']:,.0f} vs {got['straight']:,.0f} alerts/s; per 100 alerts"
            f" Python {got['python_cpu']:.2f} ms"
            + (f", server {got['backends_cpu']:.2f} ms" if "backends_cpu" in got else "")
            + ")"
            if "python_cpu" in got
            else ""
        )
        out.append(
            Row(
                figure if outbox == DEFAULT_OUTBOX else other_figure,
                f"{x:.2f}× straight httpx POSTs of the same bodies{cpu}",
                goal,
                x >= 0.5,
                "delivery",
                x,
                outbox,
            )
        )
    return out


def idle_rows(scratch: Scratch, quick: bool) -> list[Row]:
    """bench/idle.py's measure(): what 100 rules with nothing due cost the database."""
    figure = "idle, 100 rules × `every: 1s`, nothing due"
    goals = (
        "≤ 1.5× the raw probes' statements and DB time",
        "no writes while nothing happens",
        "connections ≤ 4 + delivery (a setting, not the rule count)",
    )
    parts = ("statements, DB time", "writes", "connections")
    measure = guarded("idle", "measure")
    if measure is None:
        why = "needs bench/idle.py measure()"
        return [
            not_measured(f"{figure}: {p}", g, "idle", why)
            for p, g in zip(parts, goals, strict=True)
        ]
    # It makes (and drops) its own database on the server.
    more = {}
    if quick and "reps" in inspect.signature(measure).parameters:
        more["reps"] = 1  # bench/idle.py's own rounds (3 by default): one in a smoke test
    if quick and "warm" in inspect.signature(measure).parameters:
        more["warm"] = 10.0  # not the steady state (plans still warming): a smoke test
    seconds = 3.0 if quick else 10.0
    res, failed = attempt(measure, scratch.server, rules=100, seconds=seconds, **more)
    if res is None:
        return [
            not_measured(f"{figure}: {p}", g, "idle", failed)
            for p, g in zip(parts, goals, strict=True)
        ]
    st, tx, db = (
        float(res[k]) for k in ("statements_ratio", "transactions_ratio", "db_time_ratio")
    )
    writes, conns = float(res["writes_per_cycle"]), float(res["connections"])
    limit = float(res.get("connections_limit", 8))  # 4 + one webhook's 4 batches in flight
    return [
        Row(
            f"{figure}: statements, DB time",
            f"statements {st:.2f}×, transactions {tx:.2f}×, DB time {db:.2f}× the raw probes",
            goals[0],
            st <= 1.5 and db <= 1.5,
            "idle",
            db,
        ),
        Row(f"{figure}: writes", f"{writes:,.1f} per cycle", goals[1], writes == 0, "idle"),
        Row(
            f"{figure}: connections",
            f"{conns:,.0f} (limit {limit:,.0f})",
            goals[2],
            conns <= limit,
            "idle",
        ),
        *pooled_idle_rows(measure, scratch, seconds, more),
    ]


def pooled_idle_rows(
    measure: Callable[..., Any], scratch: Scratch, seconds: float, more: dict[str, Any]
) -> list[Row]:
    """The idle DB time as behind a transaction pooler (issue 27): nothing prepared."""
    figure = "idle, 100 rules × `every: 1s`, SLAWATCH_POOLER=transaction: DB time"
    goal = "≤ 1.5× the raw probes (issue 27)"
    if "pooler" not in inspect.signature(measure).parameters:
        return [not_measured(figure, goal, "idle", "needs bench/idle.py measure(pooler=)")]
    res, failed = attempt(
        measure, scratch.server, rules=100, seconds=seconds, pooler="transaction", **more
    )
    if res is None:
        return [not_measured(figure, goal, "idle", failed)]
    db = float(res["db_time_ratio"])
    return [
        Row(
            figure,
            f"DB time {db:.2f}×, statements {float(res['statements_ratio']):.2f}× the raw probes",
            goal,
            db <= 1.5,
            "idle",
            db,
        )
    ]


def rules_rows(scratch: Scratch, quick: bool) -> tuple[list[Row], dict[str, Any] | None]:
    """bench/rules.py's measure(): slawatch's CPU and the database's with 100, 300 and
    1,000 idle rules (--quick: 10, 30, 100, one short window each: does it run?)."""
    counts = (10, 30, 100) if quick else (100, 300, 1_000)
    figure = f"idle rules × `every: 5s`, {' / '.join(f'{n:,}' for n in counts)}: CPU"
    goal = "slawatch ≤ the database at the most rules; per rule linear"
    measure = guarded("rules", "measure")
    if measure is None:
        return [not_measured(figure, goal, "rules", "needs bench/rules.py measure()")], None
    kwargs: dict[str, Any] = {"counts": counts}
    if quick:
        kwargs |= {"seconds": 5.0, "warm": 10.0, "reps": 1}
    res, failed = attempt(measure, scratch.server, **kwargs)
    if res is None:
        return [not_measured(figure, goal, "rules", failed)], None
    curve = res["curve"]
    now = ", ".join(
        f"{n:,}: slawatch {c['slawatch_cpu']:.1f} %"
        + (f", DB {c['db_cpu']:.1f} %" if "db_cpu" in c else "")
        + f", {c['per_check']:.2f} statements/check"
        for n, c in curve.items()
    )
    met = None if "cpu_ratio" not in res else res["cpu_ratio"] <= 1.0 and res["bend"] <= 1.5
    return [Row(figure, now, goal, met, "rules")], res


Figures = dict[str, tuple[float, str]]  # issue 27's key -> (the number, how measured)


def scale_section(scratch: Scratch, args: argparse.Namespace) -> tuple[Figures, dict[str, str]]:
    """bench/scale.py's measure(): the rows and backlog curves, printed; the figures of
    issue 27's two curve rows (the worse of inline's and table's rows/s at the biggest
    size over the smallest), or why not measured."""
    keys = ("rows_curve", "backlog_curve")
    measure, report = guarded("scale", "measure"), guarded("scale", "report")
    if measure is None or report is None:
        return {}, dict.fromkeys(keys, "needs bench/scale.py measure()")
    res, failed = attempt(
        measure, scratch, args.scale_rows, args.scale_due, args.batch, args.reps, args.quick
    )
    if res is None:
        return {}, dict.fromkeys(keys, failed)
    print("\n".join(report(res)))
    print()
    figures: Figures = {}
    why: dict[str, str] = {}
    for key, curve, unit in (("rows_curve", "rows", "rows"), ("backlog_curve", "backlog", "due")):
        ratio = res.get(f"{curve}_ratio")
        if ratio is None:
            why[key] = "needs two sizes or more"
            continue
        low, high = min(res[curve]), max(res[curve])
        each = ", ".join(f"{n} {res[f'{curve}_bend'][n]:.2f}×" for n in res["variants"])
        figures[key] = (ratio, f"{ratio:.2f}× ({high:,} vs {low:,} {unit}: {each})")
    return figures, why


def prune_section(args: argparse.Namespace) -> tuple[Figures, dict[str, str]]:
    """bench/prune.py's measure(): retention with --prune-alerts alerts of history
    (10 M; --quick 500 k on a small shop, one round), printed; issue 27's prune row."""
    measure, report = guarded("prune", "measure"), guarded("prune", "report")
    if measure is None or report is None:
        return {}, {"prune": "needs bench/prune.py measure()"}
    days = 10.0
    kwargs: dict[str, Any] = {"days": days}
    if args.quick:
        kwargs |= {"alerts": 500_000, "rows": 20_000, "due": 5_000, "batch": 500, "reps": 1}
    else:
        kwargs |= {"reps": args.reps}
    if args.prune_alerts:
        kwargs["alerts"] = args.prune_alerts
    res, failed = attempt(measure, **kwargs)
    if res is None:
        return {}, {"prune": failed}
    print("\n".join(report(res, days, kwargs.get("batch", 10_000), kwargs["reps"])))
    print()
    x = float(res["fraction"])
    return {
        "prune": (
            x,
            f"{x * 100:.0f} % ({res['prune_secs'] * 1000:,.0f} ms to prune {res['due']:,} alerts"
            f" vs {res['drain_secs'] * 1000:,.0f} ms to drain them, {res['alerts']:,} alerts of"
            f" history); a drain while pruning runs takes {res['slowdown']:.2f}× its time",
        )
    }, {}


def event_rows(
    scratch: Scratch,
    run: set[str],
    quick: bool,
    lap: Callable[[str], None],
    fire_outboxes: tuple[Outbox, ...] = events.OUTBOXES,
) -> list[Row]:
    """bench/events.py's sections (issue 15's table), each only if in ``run``; --quick
    runs each once, small (does it run?), the default as bench/events.py does.
    ``fire_outboxes``: --fire-outbox, the shapes the firing's claim writes (bench/events.py
    --outbox)."""

    timers, due, secs, reps, fire_reps, http_batches, messages = (
        (5_000, 5_000, 2, 1, 1, 1, 2_000) if quick else (1_000_000, 100_000, 60, 5, 3, 10, 20_000)
    )
    got: list[tuple[str, list[Any]]] = []
    if "ingest" in run:
        got.append(("ingest", events.report_ingest(scratch, reps)))
        lap("ingest")
    if "http" in run:
        got.append(("http", events.report_http(scratch, reps, http_batches)))
        lap("http")
    if "fire" in run:
        got.append(("fire", events.report_fire(scratch, due, fire_reps, False, fire_outboxes)))
        lap("fire")
    if "timerprobe" in run:
        sizes = (5_000, 20_000) if quick else events.PROBE_SIZES
        got.append(("timerprobe", events.report_probe(scratch, sizes)))
        lap("timerprobe")
    if "lateness" in run:
        got.append(("lateness", events.report_lateness(scratch, timers, 1000, secs)))
        lap("lateness")
    if "brokers" in run:
        got.append(("brokers", events.report_brokers(scratch, messages, fire_reps)))
        lap("brokers")
    return [
        Row(r.figure, r.measured, r.goal, r.met, section) for section, rows in got for r in rows
    ]


def print_rows(title: str, rows: list[Row], markdown: bool) -> None:
    print(title)
    if markdown:
        print("| figure | now | goal | command |")
        print("|---|---|---|---|")
        for r in rows:
            mark = f" (**{r.mark}**)" if r.met is not None else ""
            print(f"| {r.figure} | {r.now}{mark} | {r.goal} | `{r.command()}` |")
        return
    for r in rows:
        print(f"  {r.mark:<8} {r.figure}\n           {r.now}  (goal {r.goal}; {r.command()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3, help="measurements per variant (>= 3)")
    parser.add_argument(
        "--probe-rows",
        type=int,
        default=1_000_000,
        help="also probe an empty claim on a table of this size (0: skip)",
    )
    parser.add_argument(
        "--long-due",
        type=int,
        default=0,
        help="fresh due rows per drain of the 10-drain run (default: min(due, 10000))",
    )
    parser.add_argument(
        "--peer-due", type=int, default=0, help="deadlines for PGQueuer (default: min(due, 2000))"
    )
    parser.add_argument("--steady-secs", type=int, default=10)
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="seconds at most per drain (the naive statement may need it)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny, one run of each: 20,000 rows, 2,000 due, batch 500 (does it run? ~2 minutes)",
    )
    parser.add_argument(
        "--skip",
        default="",
        help=f"comma-separated sections to skip: {','.join(SECTIONS)} (events: the last six)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated sections to run, the others skipped (e.g. --only claim,long)",
    )
    parser.add_argument(
        "--scale-rows",
        type=lambda text: tuple(int(x) for x in text.split(",") if x.strip()),
        default=None,
        help="table sizes of the rows curve (default 1000000,3000000,10000000; --quick small)",
    )
    parser.add_argument(
        "--scale-due",
        type=lambda text: tuple(int(x) for x in text.split(",") if x.strip()),
        default=None,
        help="backlogs of the backlog curve (default 10000,100000,1000000; --quick small)",
    )
    parser.add_argument(
        "--prune-alerts",
        type=int,
        default=0,
        help="alerts of history for the prune section (default 10,000,000; --quick 500,000)",
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the table as Markdown (docs/performance.md's)",
    )
    parser.add_argument(
        "--fire-outbox",
        default=",".join(events.OUTBOXES),
        help="fire: the outbox's shapes the claim writes, comma-separated, interleaved by"
        " round, each against the same raw statement (SLAWATCH_OUTBOX: alerts, rows;"
        " default %(default)s, the default shape first: the tables' figure and verdict)",
    )
    args = parser.parse_args()
    fire_outboxes = events.fire_outboxes(args.fire_outbox)
    if fire_outboxes is None:
        parser.error("--fire-outbox: alerts, rows or both, comma-separated")
    if args.quick:
        args.rows, args.due, args.batch = 20_000, min(args.due, 2_000), 500
        args.probe_rows, args.steady_secs = 0, 2
        args.peer_due, args.long_due = args.peer_due or 500, args.long_due or 500
        args.reps = 1  # a smoke test: one run of each (its figures are not the record)
    long_due = args.long_due or min(args.due, 10_000)
    peer_due = args.peer_due or min(args.due, 2_000)
    run = (sections(args.only) or set(SECTIONS)) - sections(args.skip)
    now = datetime.now(UTC).replace(microsecond=0)
    began = time.perf_counter()
    mark = [began]

    def lap(section: str) -> None:
        """Seconds per section, on stderr: where the run's time goes."""
        t = time.perf_counter()
        print(f"[{section}: {t - mark[0]:.0f} s]", file=sys.stderr, flush=True)
        mark[0] = t

    with Scratch() as scratch:
        with psycopg.connect(scratch.server, autocommit=True) as server:
            print(machine(server))
        vs = variants()
        live = [v for v in vs if not v.skipped]
        by_name = {v.name: v for v in vs}
        due, due_ids = 0, []
        if run & SHOP_SECTIONS:  # the shop table and a migrated copy per variant
            scratch.create("base")
            loaded = load_shop(scratch.dsn("base"), args.rows, args.due, now)
            with psycopg.connect(scratch.dsn("base"), autocommit=True) as conn:
                due_ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM orders WHERE status = 'paid'"
                        " AND paid_at < %s::timestamptz - interval '48 hours' ORDER BY id",
                        (now,),
                    ).fetchall()
                ]
                heap, idx = rel_sizes(conn)
            due = len(due_ids)
            print(
                f"data: orders, 16 columns, primary key + 7 business indexes; {args.rows:,} rows"
                f" ({heap / 1e6:,.0f} MB heap, {idx / 1e6:,.0f} MB business indexes), {due:,} paid"
                f" and overdue; claim batch {args.batch:,}; loaded in {loaded:.0f} s\n"
                "each variant drains a fresh copy of the same database (CREATE DATABASE ... TEMPLATE,"
                " file copy), prewarmed and checkpointed:\nno variant sees another's dead tuples,"
                " index bloat or tracking columns, and all start from the same cache state.\n"
            )

            for v in vs:
                if v.skipped:
                    continue
                scratch.create(f"t_{v.name}", template="base")
                with psycopg.connect(scratch.dsn(f"t_{v.name}"), autocommit=True) as conn:
                    v.setup(conn, args.batch)  # type: ignore[misc]
                    conn.execute("VACUUM ANALYZE orders")

        lap("setup")
        # ---- the claim, interleaved: variant order rotates each round
        if "claim" in run:
            for r in range(args.reps):
                for v in live[r % len(live) :] + live[: r % len(live)]:
                    scratch.create("run", template=f"t_{v.name}")
                    v.runs.append(
                        measure_drain(scratch.dsn("run"), v, args.batch, now, args.budget)
                    )
                    scratch.drop("run")
            raw = next(v for v in live if v.name == "raw")
            raw_rate = [x["rate"] for x in raw.runs]
            print(
                f"CLAIM: drain {due:,} due rows, batch {args.batch:,}; {args.reps} interleaved"
                " runs each, median (min–max)"
            )
            print(
                f"{'variant':<48} {'rows/s':>24} {'vs raw':>6} {'rounds':>6} {'ms/batch':>8}"
                f" {'CPU µs/alert':>12} {'WAL B/alert':>11} {'orders upd':>10} {'HOT':>5}"
                f" {'heap +MB':>8} {'idx +MB':>7}"
            )
            for v in vs:
                if v.skipped:
                    print(f"{v.label:<48} {'skipped: ' + v.skipped:>24}")
                    continue
                rates = [x["rate"] for x in v.runs]
                runs = v.runs
                upd = med([x["upd"] for x in runs])
                hot = med([x["hot"] for x in runs])
                partial = " (budget hit)" if any(x["budget_hit"] for x in runs) else ""
                print(
                    f"{v.label:<48} {spread(rates):>24} {med(rates) / med(raw_rate):>5.2f}×"
                    f" {per_round(v.runs, raw.runs):>5.2f}×"
                    f" {med([x['ms_batch'] for x in runs]):>8.0f}"
                    f" {med([x['cpu_per'] for x in runs]):>12.1f}"
                    f" {med([x['wal_per'] for x in runs]):>11,.0f} {upd:>10,.0f}"
                    f" {(hot / upd * 100 if upd else 0):>4.0f}% {med([x['heap_mb'] for x in runs]):>8.1f}"
                    f" {med([x['idx_mb'] for x in runs]):>7.1f}{partial}"
                )
            print(
                "(vs raw: of the medians; rounds: the median of each round's ratio to that"
                " round's raw claim; CPU: the drain's server backend, user + system)"
            )
            for name in ("inline", "table"):
                dflt, alt = (by_name[shaped(name, o)] for o in (DEFAULT_OUTBOX, OTHER_OUTBOX))
                if dflt.runs and alt.runs:
                    print(
                        f"  outbox in {DEFAULT_OUTBOX} (the default) vs in {OTHER_OUTBOX},"
                        f" track: {name}: rows/s {per_round(dflt.runs, alt.runs):.2f}×"
                        f" (median of each round's ratio), server CPU per alert"
                        f" {per_round(dflt.runs, alt.runs, 'cpu_per'):.2f}×, WAL B/alert"
                        f" {med([x['wal_per'] for x in dflt.runs]):,.0f} vs"
                        f" {med([x['wal_per'] for x in alt.runs]):,.0f}"
                    )
            print()

        lap("claim")
        # ---- one batch, looked into
        if "explain" in run:
            print(
                "ONE BATCH: EXPLAIN (ANALYZE, BUFFERS, WAL) on a fresh copy, right after a"
                " checkpoint; WAL records by relation (pg_walinspect)\n(a node's time and WAL"
                " include the CTEs it reads: alert's include orders')"
            )
            for v in live:
                scratch.create("run", template=f"t_{v.name}")
                try:
                    for line in explain_batch(scratch.dsn("run"), v, args.batch, now):
                        print(line)
                finally:
                    scratch.drop("run")
            print()

        lap("explain")
        # ---- the empty probe at other sizes
        probes: dict[int, dict[str, float]] = {}
        if "claim" in run:
            probes[args.rows] = {v.name: med([x["probe_us"] for x in v.runs]) for v in live}
            probes[args.rows]["raw_auto"] = med([x["probe_auto_us"] for x in by_name["raw"].runs])
            for v in live:
                if v.name in ("inline", "table"):
                    probes[args.rows][f"{v.name}_unprep"] = med(
                        [x["probe_unprepared_us"] for x in v.runs]
                    )
        if (
            "probe" in run
            and args.probe_rows
            and (args.probe_rows != args.rows or "claim" not in run)
        ):
            scratch.create("probe")
            load_shop(scratch.dsn("probe"), args.probe_rows, max(args.probe_rows // 100, 1), now)
            probes[args.probe_rows] = {}
            for v in live:
                if v.name == "naive":
                    continue  # its "probe" reads every overdue row ever: not a probe
                scratch.create("run", template="probe")
                with psycopg.connect(scratch.dsn("run"), autocommit=True) as conn:
                    v.setup(conn, args.batch)  # type: ignore[misc]
                    conn.execute("VACUUM ANALYZE orders")
                m = measure_drain(scratch.dsn("run"), v, args.batch, now, args.budget)
                probes[args.probe_rows][v.name] = m["probe_us"]
                if v.name == "raw":
                    probes[args.probe_rows]["raw_auto"] = m["probe_auto_us"]
                if v.name in ("inline", "table"):
                    probes[args.probe_rows][f"{v.name}_unprep"] = m["probe_unprepared_us"]
                scratch.drop("run")
            scratch.drop("probe")
        if probes:
            print(
                "EMPTY PROBE: one claim with nothing due (a clock before the earliest deadline, before"
                " the drain);"
                " median of 200, µs\n(raw: custom plans; 'raw, auto': PostgreSQL's default plan"
                " cache, a generic plan after 5 runs; inline/table: prepared, as with"
                " SLAWATCH_POOLER=none or session; '_unprep': not prepared, as with the default"
                " SLAWATCH_POOLER=auto or transaction)"
            )
            names = [v.name for v in live if v.name != "naive"] + ["raw_auto"]
            names += [f"{v.name}_unprep" for v in live if v.name in ("inline", "table")]
            widths = [max(10, len(n)) for n in names]
            print(
                f"{'rows':>12} " + " ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))
            )
            for size in sorted(probes):
                print(
                    f"{size:>12,} "
                    + " ".join(
                        f"{probes[size].get(n, float('nan')):>{w},.0f}"
                        for n, w in zip(names, widths, strict=True)
                    )
                )
            print()

        lap("probe")
        # ---- 1st vs 10th drain
        long_rates: dict[str, list[float]] = {}
        sweep_ms: list[float] = []
        if "long" in run:
            for v in live:
                if v.name not in ("inline", "table"):
                    continue
                scratch.create("run", template=f"t_{v.name}")
                long_rates[v.name] = long_run(
                    scratch.dsn("run"), v, args.batch, now, long_due, args.rows, sweep_ms
                )
                scratch.drop("run")
            print(
                f"LONG RUN: 10 drains a minute apart, each of {long_due:,} orders that fell due since the last, outbox kept"
                " (deliveries marked sent between drains); retention: slawatch.runtime.maintain"
                " keeps two drains of history, the outbox (and for inline orders, as autovacuum"
                " would with the setting docs/explanation/tracking.md advises) vacuumed between drains"
            )
            for name, rates in long_rates.items():
                print(
                    f"  {name}: rows/s per drain "
                    + " ".join(f"{r:,.0f}" for r in rates)
                    + f"; 10th / 1st = {rates[-1] / rates[0]:.2f},"
                    f" median of drains 8-10 / of 1-3 = {med(rates[7:]) / med(rates[:3]):.2f}"
                )
            if sweep_ms:
                print(
                    f"  table: one sweep after the 10 drains ({10 * long_due:,} open episodes,"
                    f" every `sweep`, 10m by default): {sweep_ms[0]:,.0f} ms"
                )
            print()

        lap("long")
        # ---- end to end
        # By shape of the outbox (docs/explanation/outbox-rows.md): the default's, the other's.
        e2e: dict[str, float] = {}
        e2e_other: dict[str, float] = {}
        if "e2e" in run:
            for outbox, into in ((DEFAULT_OUTBOX, e2e), (OTHER_OUTBOX, e2e_other)):
                scratch.create("run", template="t_inline")
                into |= end_to_end(
                    scratch.dsn("run"),
                    due,
                    args.batch,
                    1000,
                    args.steady_secs,
                    args.rows,
                    outbox,
                )
                scratch.drop("run")
            print(
                f"END TO END: `slawatch run` (subprocess, LISTEN/NOTIFY, webhook batch"
                f" {e2e['per_post']:.0f}) -> HTTP receiver in this process;"
                f" alerts of {e2e['alert_bytes']:.0f} bytes (4 row columns)"
            )
            for title, one in (
                (f"SLAWATCH_OUTBOX={DEFAULT_OUTBOX} (the default)", e2e),
                (f"SLAWATCH_OUTBOX={OTHER_OUTBOX}", e2e_other),
            ):
                print(
                    f"  {title}: burst of {due:,}: {one['e2e_rate']:,.0f} alerts/s (first claim"
                    f" -> last receipt); the same POSTs sent straight from another process:"
                    f" {one['raw_post_rate']:,.0f} alerts/s"
                    f" ({one['e2e_rate'] / one['raw_post_rate']:.2f}×)"
                )
                print(
                    f"    steady 1,000 new due rows/s for {args.steady_secs} s (rule every 1s):"
                    f" {one['steady_n']:,.0f} of {one['steady_expected']:,.0f} received;"
                    f" claim -> receipt p50 {one['claim_p50']:,.0f} ms, p99 {one['claim_p99']:,.0f}"
                    f" ms; due -> receipt p50 {one['due_p50']:,.0f} ms, p99 {one['due_p99']:,.0f} ms"
                )
            print()

        lap("e2e")
        # ---- 1 / 2 / 4 processes
        proc_rates: dict[int, list[float]] = {1: [], 2: [], 4: []}
        if "procs" in run:
            for _ in range(args.reps):
                for n in proc_rates:
                    scratch.create("run", template="t_inline")
                    proc_rates[n].append(processes(scratch.dsn("run"), n, args.batch, now))
                    scratch.drop("run")
            base = med(proc_rates[1])
            print(
                "PROCESSES: slawatch inline, N processes draining the same rule with claim_batch,"
                f" {args.reps} runs each"
            )
            for n, rates in proc_rates.items():
                print(f"  {n}: {spread(rates):>26} rows/s  ({med(rates) / base:.2f}×)")
            print()

        lap("procs")
        # ---- the peer
        peer_res: dict[str, float] = {}
        peer_e2e: dict[str, float] = {}
        why = pgqueuer_status()
        if "peer" in run and why is None:
            ids = due_ids[:peer_due]
            scratch.create("run", template="base")
            peer_res = peer(scratch.dsn("run"), ids, 100, None)
            scratch.drop("run")
            receiver = Receiver()
            scratch.create("run", template="base")
            peer_e2e = peer(scratch.dsn("run"), ids, 100, receiver.url)
            arrivals = [t for t, _ in receiver.arrived.values()]
            if len(arrivals) > 1:
                peer_e2e["rate"] = len(arrivals) / (max(arrivals) - min(arrivals))
            scratch.drop("run")
            # The receiver's limit for one alert per request, from another process.
            single = [
                json.dumps({"alerts": [a]}).encode()
                for _, a in list(receiver.arrived.values())[:2000]
            ]
            peer_e2e["single_post_rate"] = post_straight(receiver.url, single, 1) if single else 0
            receiver.server.shutdown()
            import pgqueuer

            print(
                f"PEER: PGQueuer {pgqueuer.__version__} (asyncpg), one job per deadline"
                f" ({len(ids):,} due, enqueued beforehand, untimed); handler: still paid? ->"
                " alert row (one statement); batch_size 100"
            )
            print(
                f"  claim + alert: {peer_res['rate']:,.0f} alerts/s (first to last alert;"
                f" wall time with start and drain exit {peer_res['wall']:.1f} s), WAL {peer_res['wal_per']:,.0f}"
                f" B/alert (+ {peer_res['enq_wal_per']:,.0f} B/job to enqueue)"
            )
            print(
                f"  end to end (handler POSTs its alert to the receiver): {peer_e2e['rate']:,.0f}"
                f" alerts/s; one-alert POSTs sent straight: {peer_e2e['single_post_rate']:,.0f}/s"
            )
            print(
                "  jobs only for the due orders: a shop would enqueue one per paid order, which"
                " flatters the peer\n"
            )
        elif "peer" in run and why:
            print(f"PEER: PGQueuer {why}\n")

        lap("peer")
        # ---- the rows other helpers' code measures, and the event figures
        other: list[Row] = []
        if "delivery" in run:
            other += delivery_rows(args.quick)
            lap("delivery")
        if "idle" in run:
            other += idle_rows(scratch, args.quick)
            lap("idle")
        curve: dict[str, Any] | None = None
        if "rules" in run:
            got_rules, curve = rules_rows(scratch, args.quick)
            other += got_rules
            lap("rules")
        event_table = (
            event_rows(scratch, run, args.quick, lap, fire_outboxes)
            if run & set(EVENT_SECTIONS)
            else []
        )
        more_figures: Figures = {}
        more_why: dict[str, str] = {}
        if "scale" in run:
            got, why_not = scale_section(scratch, args)
            more_figures |= got
            more_why |= why_not
            lap("scale")
        if "prune" in run:
            got, why_not = prune_section(args)
            more_figures |= got
            more_why |= why_not
            lap("prune")

        # ---- the issue's table
        by = {v.name: v for v in vs if v.runs}

        def rate(name: str) -> float | None:
            v = by.get(name)
            return med([x["rate"] for x in v.runs]) if v else None

        def wal(name: str) -> float | None:
            v = by.get(name)
            return med([x["wal_per"] for x in v.runs]) if v else None

        # The tables' figures are the default shape's of the outbox (DEFAULT_OUTBOX), the
        # other shape's beside them (beside()).
        r_raw = rate("raw")
        r_in, r_tab = (rate(shaped(n, DEFAULT_OUTBOX)) for n in ("inline", "table"))

        def other_claim(name: str) -> str | None:
            """The claim of ``name`` writing the other shape of the outbox, for beside the
            default's figure."""
            alt, dflt = by.get(shaped(name, OTHER_OUTBOX)), by.get(shaped(name, DEFAULT_OUTBOX))
            if alt is None or r_raw is None:
                return None
            rate_o = med([x["rate"] for x in alt.runs])
            vs = (
                f", {per_round(alt.runs, dflt.runs):.2f}× the default's, server CPU per alert"
                f" {per_round(alt.runs, dflt.runs, 'cpu_per'):.2f}× the default's"
                if dflt
                else ""
            )
            return (
                f"{rate_o / r_raw:.2f}× ({rate_o:,.0f} rows/s{vs},"
                f" WAL {med([x['wal_per'] for x in alt.runs]):,.0f} B/alert)"
            )

        def least_wal(outbox: Outbox) -> tuple[str, float] | None:
            """The track (table, inline) writing the least WAL per alert in ``outbox``."""
            got = [(n, w) for n in ("table", "inline") if (w := wal(shaped(n, outbox)))]
            return min(got, key=lambda x: x[1]) if got else None

        rows = [r for r in other if r.section == "delivery"]
        if "delivery" not in run:
            rows.append(not_measured("delivery", "≥ 0.5× straight POSTs", "delivery", "skipped"))
        rows += [r for r in other if r.section in ("idle", "rules")]
        if "idle" not in run:
            rows.append(not_measured("idle, 100 rules", "≤ 1.5× raw probes", "idle", "skipped"))
        # The claim's size, else the probe section's own (--only probe).
        size = args.rows if args.rows in probes else max(probes, default=args.rows)
        probe = probes.get(size, {})
        for name in ("inline", "table"):
            figure = (
                f"empty probe, unprepared (SLAWATCH_POOLER=transaction, or auto through a pooler), track: {name},"
                f" {size:,} rows"
            )
            goal = "≤ 1.5× raw"
            ours, raw_us = probe.get(f"{name}_unprep"), probe.get("raw")
            if ours is None or raw_us is None:
                rows.append(not_measured(figure, goal, "claim", "skipped"))
                continue
            rows.append(
                Row(
                    figure,
                    f"{ours / raw_us:.1f}× the raw statement ({ours:,.0f} vs {raw_us:,.0f} µs;"
                    f" prepared: {probe.get(name, float('nan')):,.0f} µs)",
                    goal,
                    ours <= 1.5 * raw_us,
                    "claim",
                )
            )
        for name, rate_, least in (("table", r_tab, 2.5), ("inline", r_in, 0.95)):
            figure = f"`track: {name}` claim + outbox, {due:,} due, batch {args.batch:,}"
            if rate_ is None or r_raw is None:
                reason = "track: table not built" if by_name[name].skipped else "skipped"
                rows.append(not_measured(figure, f"≥ {least}× raw", "claim", reason))
                continue
            rows.append(
                Row(
                    figure,
                    beside(
                        f"{rate_ / r_raw:.2f}× the seed's raw claim ({rate_:,.0f} vs"
                        f" {r_raw:,.0f} rows/s)",
                        other_claim(name),
                    ),
                    f"≥ {least}× raw",
                    rate_ / r_raw >= least,
                    "claim",
                )
            )
        for name in ("table", "inline"):
            figure = f"`track: {name}`, 10th drain vs 1st in a long run"
            goal = "≥ 0.9× with retention running" if name == "table" else "printed"
            lr = long_rates.get(name)
            if not lr:
                rows.append(not_measured(figure, goal, "long", "skipped"))
                continue
            # Single drains are short and the machine noisy: medians of three at each end.
            late = med(lr[7:]) / med(lr[:3])
            rows.append(
                Row(
                    figure,
                    f"{late:.2f}× (drains 8–10 vs 1–3, rows/s)",
                    goal,
                    late >= 0.9 if name == "table" else None,
                    "long",
                )
            )
        figure = "WAL per alert vs PGQueuer (its run + enqueue)"
        w_dflt, w_alt = least_wal(DEFAULT_OUTBOX), least_wal(OTHER_OUTBOX)
        if peer_res and w_dflt:
            name, best_w = w_dflt
            peer_wal = peer_res["wal_per"] + peer_res["enq_wal_per"]
            rows.append(
                Row(
                    figure,
                    beside(
                        f"{best_w / peer_wal:.2f}× (track: {name} {best_w:,.0f} vs"
                        f" {peer_wal:,.0f} B)",
                        f"{w_alt[1] / peer_wal:.2f}× (track: {w_alt[0]} {w_alt[1]:,.0f} B)"
                        if w_alt
                        else None,
                    ),
                    "≤ 0.2×",
                    best_w <= 0.2 * peer_wal,
                    "claim,peer",
                    best_w / peer_wal,
                )
            )
        else:
            rows.append(not_measured(figure, "≤ 0.2×", "claim,peer", why or "skipped"))
        # Figures with no goal this round, printed beside the table.
        if e2e:
            rows.append(
                Row(
                    f"end to end: `slawatch run` → webhook, burst of {due:,}",
                    beside(
                        f"{e2e['e2e_rate'] / e2e['raw_post_rate']:.2f}× the same POSTs sent"
                        f" straight; steady 1,000/s claim → receipt p99 {e2e['claim_p99']:,.0f} ms",
                        f"{e2e_other['e2e_rate'] / e2e_other['raw_post_rate']:.2f}×, p99"
                        f" {e2e_other['claim_p99']:,.0f} ms"
                        if e2e_other
                        else None,
                    ),
                    "printed",
                    None,
                    "e2e",
                )
            )
        if proc_rates[1] and proc_rates[2]:
            rows.append(
                Row(
                    "1 / 2 / 4 claiming processes",
                    " / ".join(f"{med(proc_rates[n]) / med(proc_rates[1]):.2f}" for n in proc_rates)
                    + "×",
                    "printed",
                    None,
                    "procs",
                )
            )
        if peer_res and (r_in or r_tab):
            best = max(r for r in (r_in, r_tab) if r)
            rows.append(
                Row(
                    "claim + outbox vs PGQueuer's claim + alert",
                    f"{best / peer_res['rate']:.1f}× ({best:,.0f} vs {peer_res['rate']:,.0f} alerts/s)",
                    "printed",
                    None,
                    "claim,peer",
                )
            )
        scale = "--quick" if args.quick else f"{args.rows:,} rows, {due:,} due"
        print_rows(
            f"ISSUE 18: THE TABLE ({scale}; medians of {args.reps} interleaved runs where"
            " repeated)",
            rows,
            args.markdown,
        )
        if event_table:
            print()
            print_rows("EVENTS (issue 15's table, bench/events.py)", event_table, args.markdown)
        # ---- issue 27's table: the figures above, each beside its goal
        figures: Figures = dict(more_figures)
        why: dict[str, str] = dict(more_why)
        for name, rate_ in (("table", r_tab), ("inline", r_in)):
            if rate_ is not None and r_raw is not None:
                figures[name] = (
                    rate_ / r_raw,
                    beside(
                        f"{rate_ / r_raw:.2f}× ({rate_:,.0f} vs {r_raw:,.0f} rows/s,"
                        f" {due:,} due, batch {args.batch:,})",
                        other_claim(name),
                    ),
                )
            elif by_name[name].skipped:
                why[name] = "track: table not built"
        if e2e and r_raw is not None:
            x = e2e["e2e_rate"] / r_raw
            figures["e2e"] = (
                x,
                beside(
                    f"{x:.2f}× ({e2e['e2e_rate']:,.0f} vs {r_raw:,.0f} alerts/s)",
                    f"{e2e_other['e2e_rate'] / r_raw:.2f}× ({e2e_other['e2e_rate']:,.0f} alerts/s)"
                    if e2e_other
                    else None,
                ),
            )
        elif e2e:
            why["e2e"] = "needs the claim section too (its raw claim)"
        for key, section, label in (
            ("delivery", "delivery", "delivery"),
            ("idle", "idle", "statements, DB time"),
            ("idle_pooler", "idle", "SLAWATCH_POOLER=transaction"),
        ):
            for r in other:
                if r.section == section and label in r.figure and r.outbox == DEFAULT_OUTBOX:
                    if r.value is not None:
                        figures[key] = (r.value, r.now)
                    else:
                        why[key] = r.now.removeprefix("not measured (").removesuffix(")")
        other_row = next(
            (r for r in other if r.section == "delivery" and r.outbox == OTHER_OUTBOX), None
        )
        if "delivery" in figures and other_row is not None and other_row.value is not None:
            x, detail = figures["delivery"]
            figures["delivery"] = (x, beside(detail, other_row.now))
        wal_row = next((r for r in rows if r.figure.startswith("WAL per alert")), None)
        if wal_row is not None and wal_row.value is not None:
            # The ratio itself, not its rounded text: the same verdict as issue 18's row.
            figures["wal"] = (wal_row.value, wal_row.now)
        for key, words in (
            ("event", ("pipelined",)),
            ("fire", ("firing due timers",)),
            ("timer_bytes", ("bytes per open timer",)),
        ):
            # bench/events.py's figure of the default shape of the outbox (unlabeled); with
            # --fire-outbox, the other shape's (SLAWATCH_OUTBOX=<shape>) beside it.
            found = event_figure(event_table, *words, but="SLAWATCH_OUTBOX=")
            shape = event_figure(event_table, *words, f"SLAWATCH_OUTBOX={OTHER_OUTBOX}")
            other_text = shape[1] if key == "fire" and shape is not None else None
            if found is not None:
                figures[key] = (found[0], beside(found[1], other_text))
            elif other_text is not None:
                why[key] = beside(f"--fire-outbox without {DEFAULT_OUTBOX}", other_text)
            elif event_table:
                why[key] = "not among bench/events.py's rows"
        if curve is not None:
            most, fewest = max(curve["curve"]), min(curve["curve"])
            c = curve["curve"][most]
            if "cpu_ratio" in curve:
                figures["rules_cpu"] = (
                    curve["cpu_ratio"],
                    f"{curve['cpu_ratio']:.2f}× ({most:,} rules: slawatch {c['slawatch_cpu']:.1f} %,"
                    f" the database {c['db_cpu']:.1f} % of a core)",
                )
            else:
                why["rules_cpu"] = "the server is not a process of this machine"
            figures["rules_bend"] = (
                curve["bend"],
                f"{curve['bend']:.2f}× ({most:,} vs {fewest:,} rules)",
            )
        print()
        print_rows(
            f"ISSUE 27: THE TABLE ({scale}; medians of {args.reps} interleaved runs where"
            " repeated)",
            issue27_rows(figures, why),
            args.markdown,
        )
        print(
            f"\nwhole run: {time.perf_counter() - began:.0f} s, load average"
            f" {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs); scratch databases"
            " dropped"
        )


if __name__ == "__main__":
    main()
