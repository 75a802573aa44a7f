"""Retention at volume: what pruning costs a drain, with millions of alerts of history.

Issue 18 asks whether bounded DELETE batches (slawatch/runtime/maintain.py) stay
cheap when the outbox holds 10 M alerts, or whether slawatch.alert/delivery must be
partitioned by day so that retention drops whole partitions. This loads ALERTS
alerts of history (each with its delivery, sent, and its episode, ended) straight
into slawatch's tables with generate_series, spread over --days days in daily id
ranges, and a shop table (bench/run.py's) whose fresh overdue orders each drain
claims. The retention window's edge moves a day before each step that prunes, as a
day passes between a running slawatch's drops: each such step finds one day's range
past the window (a pruner that dropped every range past a fixed edge in its first
step would leave the later steps nothing to prune). So the history must span more
than twice --reps days. Then, interleaved, --reps rounds of:

- a drain alone: --due fresh overdue orders claimed (claim + outbox);
- the same drain while the pruner deletes old history batch after batch (prune_batch,
  5,000 alerts per statement, on its own connection), as `slawatch run` would when
  both fall at the same time;
- the pruner alone, timed until it has removed as many alerts as a drain writes: the
  cost of keeping the tables at the retention window, per drain.

It prints the drain's slowdown while pruning runs and the pruner's time as a
fraction of a drain's; the issue's line: above 10 %, partition and drop instead.

    .venv/bin/python bench/prune.py                     # 10 M alerts: loading takes minutes
    .venv/bin/python bench/prune.py --alerts 1000000    # a smaller history
    .venv/bin/python bench/prune.py --json              # the figures as JSON on stdout
    .venv/bin/python bench/prune.py --outbox rows       # the outbox in rows: by row vs a drop

With ``--outbox rows`` it measures the outbox in rows instead (0026_outbox_rows_ranges.sql):
--days daily id ranges of rows (100 alerts each, every send sent), each a drain's worth
(--due alerts), then --reps rounds of pruning one range's rows row by row (prune_outbox_rows,
as before 0026 and for a range retention must keep) and dropping the next range whole
(history_drop): the time and WAL of each.

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
Every database it makes is dropped at the end.
"""

# ruff: noqa: RUF001, E501

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdb import Scratch
from run import add_due, drain, load_shop, lsn, med, rule_dict, walk

from slawatch.config.rules import Rule
from slawatch.engine.claim import batches
from slawatch.engine.migrate import migrate
from slawatch.engine.queries import queries
from slawatch.engine.ready import prepare
from slawatch.runtime.maintain import BATCH as PRUNE_BATCH
from slawatch.runtime.maintain import drop_range, prune_batch, prune_ranges

TABLES = ("slawatch.alert", "slawatch.delivery", "slawatch.episode")
CHUNK = 1_000_000  # rows per INSERT: a bounded transaction while loading

# History as the claim writes it: one alert per episode (#1), its delivery sent 50 ms
# later, its episode ended an hour after; keys 'h<g>' never meet the shop's order ids.
# Alert ids follow fired_at, as the identity column makes them in a real run.
LOAD_ALERTS = """
INSERT INTO slawatch.alert (id, rule, key, episode, n, severity, deadline, due_at,
                            fired_at, row_data, kind)
OVERRIDING SYSTEM VALUE
SELECT g, %(rule)s, 'h' || g, 1, 1, 'warning', f - interval '49 hours',
       f - interval '1 hour', f,
       jsonb_build_object('id', g, 'user_id', mod(g * 7919, 200000),
                          'total_cents', 1000 + mod(g * 7, 90000),
                          'email', 'user' || mod(g * 7919, 200000) || '@example.com'),
       'firing'
  FROM (SELECT g, %(start)s::timestamptz + (g - 1) * %(gap)s::interval AS f
          FROM generate_series(%(first)s::bigint, %(last)s::bigint) g) x
"""
LOAD_DELIVERIES = """
INSERT INTO slawatch.delivery (alert_id, notifier, status, attempts, next_attempt_at, sent_at)
SELECT g, 'ops-webhook', 'sent', 1, f, f + interval '50 milliseconds'
  FROM (SELECT g, %(start)s::timestamptz + (g - 1) * %(gap)s::interval AS f
          FROM generate_series(%(first)s::bigint, %(last)s::bigint) g) x
"""
LOAD_EPISODES = """
INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at, ended_at)
SELECT %(rule)s, 'h' || g, 1, f - interval '49 hours', f - interval '1 hour', f,
       f + interval '1 hour'
  FROM (SELECT g, %(start)s::timestamptz + (g - 1) * %(gap)s::interval AS f
          FROM generate_series(%(first)s::bigint, %(last)s::bigint) g) x
"""


def indexes_off(conn: psycopg.Connection[Any]) -> list[str]:
    """Drop the unique constraints and indexes of the outbox tables (a bulk load then
    builds each index once, sorted); return the statements that put them back."""
    restore: list[str] = []
    for table in TABLES:
        for name, ddl in conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype IN ('p', 'u')",
            (table,),
        ).fetchall():
            conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
            restore.append(f"ALTER TABLE {table} ADD CONSTRAINT {name} {ddl}")
        for name, ddl in conn.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
            (table,),
        ).fetchall():
            conn.execute(f"DROP INDEX slawatch.{name}")
            restore.append(ddl)
    return restore


def load_history(dsn: str, alerts: int, days: float, end: datetime) -> float:
    """``alerts`` alerts (with deliveries and episodes) fired evenly over ``days`` days
    up to ``end``; seconds it took, indexes built and vacuumed."""
    t = time.perf_counter()
    gap = timedelta(days=days) / alerts
    start = end - gap * alerts
    with psycopg.connect(dsn, autocommit=True) as conn:
        ranges(conn, alerts, start, gap, end)
        restore = indexes_off(conn)
        for first in range(1, alerts + 1, CHUNK):
            params = {
                "rule": rule_dict(1)["name"],
                "start": start,
                "gap": gap,
                "first": first,
                "last": min(first + CHUNK - 1, alerts),
            }
            for stmt in (LOAD_ALERTS, LOAD_DELIVERIES, LOAD_EPISODES):
                conn.execute(stmt, params)
            print(f"  loaded {params['last']:,} alerts", file=sys.stderr, flush=True)
        conn.execute("SET maintenance_work_mem = '1GB'")
        for ddl in restore:
            conn.execute(ddl)
        conn.execute("SELECT setval(pg_get_serial_sequence('slawatch.alert', 'id'), %s)", (alerts,))
        conn.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - t


def ranges(
    conn: psycopg.Connection[Any], alerts: int, start: datetime, gap: timedelta, end: datetime
) -> None:
    """The id ranges (0015_rotate.sql) a run of ``slawatch run`` rotating daily would
    have left: one per day of the history, closed at its end, then the open one."""
    conn.execute("DROP TABLE slawatch.alert_h0, slawatch.delivery_h0")
    conn.execute("DELETE FROM slawatch.history_range")
    per_day = max(1, int(timedelta(days=1) / gap))
    n, low = 0, 0
    while low <= alerts:
        high = min(low + per_day, alerts + 1) if low else per_day
        opened = start + gap * max(low - 1, 0)
        conn.execute("SELECT slawatch.history_open(%s, %s, %s, %s)", (n, low, high, opened))
        conn.execute(
            "UPDATE slawatch.history_range SET closed_at = %s WHERE n = %s",
            (min(start + gap * (high - 1), end), n),
        )
        n, low = n + 1, high
    conn.execute("SELECT slawatch.history_open(%s, %s, %s, %s)", (n, alerts + 1, 1 << 32, end))


def prune_step(conn: psycopg.Connection[Any], cutoff: datetime) -> int:
    """What retention does per run: drop a range past the window if one can go, else
    a batch of what drops leave (prune_batch); the alerts removed."""
    got = drop_range(conn, cutoff)
    if got.ranges:
        return got.alerts
    return prune_batch(conn, cutoff).alerts


def explain_prune(conn: psycopg.Connection[Any], cutoff: datetime) -> list[str]:
    """Where one prune batch's time goes: EXPLAIN (ANALYZE, BUFFERS, WAL) of its two
    statements (prune_history, prune_episodes), rolled back; their CTEs and DELETEs."""
    conn.execute("CHECKPOINT")  # as in steady state: each old page's first change since one
    lines = [f"ONE PRUNE BATCH of {PRUNE_BATCH:,} (EXPLAIN ANALYZE, rolled back; times inclusive)"]
    # As prune_batch runs it: on the oldest id range drops leave, JIT off.
    ranges = prune_ranges(conn, cutoff)
    lo, hi = ranges[0] if ranges else (0, 0)
    params = {"cutoff": cutoff, "batch": PRUNE_BATCH, "lo": lo, "hi": hi}
    for name in ("prune_history", "prune_episodes"):
        stmt = "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + queries()[name]
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL jit = off")
            row = conn.execute(stmt, params).fetchone()
        doc = row[0][0] if row else {}
        nodes: list[dict[str, Any]] = []
        walk(doc["Plan"], nodes)
        top = doc["Plan"]
        lines.append(
            f"  {name}: {doc.get('Execution Time', 0.0):,.0f} ms, WAL"
            f" {top.get('WAL Bytes', 0) / 1e6:,.1f} MB ({top.get('WAL FPI', 0):,} full pages)"
        )
        for n in nodes:
            what = n.get("Subplan Name") or ""
            if n.get("Node Type") == "ModifyTable":
                what = f"{n.get('Operation')} {n.get('Relation Name')}"
            elif not what.startswith("CTE "):
                continue
            if n.get("Actual Total Time", 0) < 1:
                continue
            lines.append(
                f"    {what:<28} {n.get('Actual Total Time', 0):>7,.0f} ms, buffers hit"
                f" {n.get('Shared Hit Blocks', 0):>8,} read {n.get('Shared Read Blocks', 0):>7,}"
                f" dirtied {n.get('Shared Dirtied Blocks', 0):>6,}; WAL"
                f" {n.get('WAL Bytes', 0) / 1e6:,.1f} MB ({n.get('WAL FPI', 0):,} full pages)"
            )
    return lines


@dataclass
class Pruner:
    """prune_batch in a loop on its own connection until stopped; what it removed and
    how long its statements took. An exception in the thread is kept and re-raised by
    :meth:`stop`, so a failed pruner never reads as a cheap one."""

    dsn: str
    cutoff: datetime
    alerts: int = 0
    busy: float = 0.0
    batches: list[float] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.is_set():
                    t = time.perf_counter()
                    got = prune_step(conn, self.cutoff)
                    self.batches.append(time.perf_counter() - t)
                    self.busy += self.batches[-1]
                    self.alerts += got
                    if got < PRUNE_BATCH:
                        return  # nothing old left: the history is too short for the run
        except BaseException as exc:  # re-raised in the caller's thread by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the pruner failed: {self.error!r}") from self.error


def prune_alone(conn: psycopg.Connection[Any], cutoff: datetime, alerts: int) -> dict[str, float]:
    """Batches until ``alerts`` alerts are gone: seconds, WAL, batches."""
    removed, times = 0, []
    wal0 = lsn(conn)
    while removed < alerts:
        t = time.perf_counter()
        got = prune_step(conn, cutoff)
        # The episode history still goes by DELETE batches: as many as alerts went.
        for _ in range(0, got, PRUNE_BATCH):
            conn.execute(queries()["prune_episodes"], {"cutoff": cutoff, "batch": PRUNE_BATCH})
        times.append(time.perf_counter() - t)
        removed += got
        if got < PRUNE_BATCH:
            raise RuntimeError("the history ran out of prunable alerts: raise --alerts")
    # A range dropped whole removes more than a drain's worth: its cost per alert, a
    # drain's worth of it.
    scale = alerts / removed
    return {
        "secs": sum(times) * scale,
        "alerts": removed,
        "wal_per": (lsn(conn) - wal0) / removed,
        "ms_batch": med(times) * 1000,
    }


def measure(
    alerts: int = 10_000_000,
    rows: int = 1_000_000,
    due: int = 50_000,
    batch: int = 10_000,
    reps: int = 3,
    days: float = 10.0,
    log: Any = sys.stderr,
) -> dict[str, Any]:
    """The whole measurement on scratch databases; the figures (medians) and every run."""
    if days <= 2 * reps or alerts / days < due:
        raise ValueError(
            f"{days:g} days of history cannot give {2 * reps} pruning steps a day's range"
            f" of {due:,} alerts or more each: raise --days or --alerts"
        )
    now = datetime.now(UTC).replace(microsecond=0)
    rule = Rule.model_validate(rule_dict(batch))
    end = now - timedelta(hours=1)
    start = end - timedelta(days=days) / alerts * alerts  # load_history's first alert
    edges = [start + timedelta(days=k + 1) for k in range(2 * reps)]  # one per pruning step
    runs: dict[str, list[dict[str, float]]] = {"alone": [], "pruning": [], "prune": []}
    with Scratch() as scratch:
        dsn = scratch.create("prune")
        t = time.perf_counter()
        load_shop(dsn, rows, 0, now)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, [rule])
        shop_secs = time.perf_counter() - t
        print(f"shop of {rows:,} orders loaded in {shop_secs:.0f} s", file=log, flush=True)
        history_secs = load_history(dsn, alerts, days, end)
        print(f"history of {alerts:,} alerts loaded in {history_secs:.0f} s", file=log, flush=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            sizes = conn.execute(
                "SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) t",
                (list(TABLES),),
            ).fetchone()
            next_id, minute = rows + 1, 0

            def one_drain(pruner: Pruner | None) -> dict[str, float]:
                nonlocal next_id, minute
                minute += 1
                at = now + timedelta(minutes=minute)
                add_due(conn, next_id, due, at)
                next_id += due
                # What the delivery workers and autovacuum do between drains.
                conn.execute(
                    "UPDATE slawatch.delivery SET status = 'sent' WHERE status = 'pending'"
                )
                conn.execute("VACUUM ANALYZE orders")
                conn.execute("CHECKPOINT")
                step = batches(conn, prepare(conn, rule), at)
                if pruner is not None:
                    pruner.start()
                got, _, secs = drain(step, batch, 1e9)
                out = {"rows": got, "secs": secs, "rate": got / secs}
                if pruner is not None:
                    pruner.stop()
                    out |= {"pruned": pruner.alerts, "prune_busy": pruner.busy}
                if got != due:
                    raise RuntimeError(f"the drain claimed {got:,} of {due:,}")
                return out

            def pruning_alone() -> dict[str, float]:
                conn.execute("CHECKPOINT")
                return prune_alone(conn, edges.pop(0), due)

            steps: list[tuple[str, Callable[[], dict[str, float]]]] = [
                ("alone", lambda: one_drain(None)),
                ("pruning", lambda: one_drain(Pruner(dsn, edges.pop(0)))),
                ("prune", pruning_alone),
            ]
            for r in range(reps):
                for name, fn in steps[r % 3 :] + steps[: r % 3]:
                    runs[name].append(fn())
                    print(f"  round {r + 1} {name}: {runs[name][-1]}", file=log, flush=True)
            # One batch of what drops leave, at the next edge (its range not dropped).
            profile = explain_prune(conn, start + timedelta(days=2 * reps + 1))
    alone = med([x["secs"] for x in runs["alone"]])
    pruning = med([x["secs"] for x in runs["pruning"]])
    prune = med([x["secs"] for x in runs["prune"]])
    return {
        "alerts": alerts,
        "due": due,
        "history_mb": float(sizes[0]) / 1e6 if sizes and sizes[0] else 0.0,
        "load_secs": history_secs,
        "drain_secs": alone,
        "drain_rate": med([x["rate"] for x in runs["alone"]]),
        "drain_pruning_secs": pruning,
        "slowdown": pruning / alone,
        "pruned_during": med([x["pruned"] for x in runs["pruning"]]),
        "prune_secs": prune,
        "prune_rate": due / prune,
        "prune_ms_batch": med([x["ms_batch"] for x in runs["prune"]]),
        "prune_wal_per": med([x["wal_per"] for x in runs["prune"]]),
        "fraction": prune / alone,
        "runs": runs,
        "profile": profile,
    }


def report(res: dict[str, Any], days: float, batch: int, reps: int) -> list[str]:
    """measure()'s figures as printed lines (bench/run.py's prune section prints these)."""
    alerts, due = res["alerts"], res["due"]
    verdict = "≤ 10 %: bounded batches suffice" if res["fraction"] <= 0.10 else "> 10 %: partition"
    return [
        f"PRUNING at {alerts:,} alerts of history (with their deliveries and episodes,"
        f" {res['history_mb']:,.0f} MB, {days:g} days in daily ranges; the window's edge"
        f" a day later at each pruning step), loaded in {res['load_secs']:.0f} s;\n{reps} interleaved rounds,"
        f" medians; a drain claims {due:,} overdue orders (batch {batch:,})",
        f"  drain alone:           {res['drain_secs'] * 1000:8,.0f} ms ({res['drain_rate']:,.0f} alerts/s)",
        f"  drain while pruning:   {res['drain_pruning_secs'] * 1000:8,.0f} ms"
        f" ({res['slowdown']:.2f}× the time; the pruner removed {res['pruned_during']:,.0f} alerts meanwhile)",
        f"  pruning {due:,} alerts: {res['prune_secs'] * 1000:8,.0f} ms"
        f" ({res['prune_rate']:,.0f} alerts/s, {res['prune_ms_batch']:,.0f} ms per batch of"
        f" {PRUNE_BATCH:,}, WAL {res['prune_wal_per']:,.0f} B/alert)",
        f"  pruning as a fraction of a drain's time (as many alerts removed as a drain writes):"
        f" {res['fraction'] * 100:.0f} % ({verdict})",
        *res["profile"],
    ]


# A day's rows of the outbox in rows: 100 alerts each (row_data about 100 B an alert),
# one send each to one notifier, sent; their ids in the range's [lo, hi).
LOAD_ROWS = """
INSERT INTO slawatch.outbox_row (id, rule, kind, fired_at, after, notifiers, keys, episodes, ns,
                                 severities, deadlines, row_data)
OVERRIDING SYSTEM VALUE
SELECT g, %(rule)s, 'firing', f, interval '1 hour', '{ops-webhook}',
       ARRAY(SELECT 'h' || g || '-' || i FROM generate_series(1, 100) i),
       array_fill(1, ARRAY[100]), array_fill(1, ARRAY[100]), array_fill('warning'::text, ARRAY[100]),
       array_fill(f - interval '49 hours', ARRAY[100]),
       ARRAY(SELECT jsonb_build_object('id', g * 100 + i, 'user_id', mod(i * 7919, 200000),
                                       'email', 'user' || mod(i * 7919, 200000) || '@example.com')
               FROM generate_series(1, 100) i)
  FROM (SELECT g, %(start)s::timestamptz + (g - %(lo)s) * %(gap)s::interval AS f
          FROM generate_series(%(lo)s::bigint, %(lo)s::bigint + %(rows)s - 1) g) x
"""
LOAD_SENDS = """
INSERT INTO slawatch.outbox_send (row_id, notifier, status, attempts, done, next_attempt_at,
                                  sent_at)
SELECT id, 'ops-webhook', 'sent', 1, 100, fired_at, fired_at + interval '50 milliseconds'
  FROM slawatch.outbox_row WHERE id >= %(lo)s AND id < %(lo)s + %(rows)s
"""


def measure_rows(
    due: int = 50_000, reps: int = 3, days: int = 8, log: Any = sys.stderr
) -> dict[str, Any]:
    """The outbox in rows: pruning a drain's worth of rows (``due`` alerts, ``due`` / 100
    rows) row by row against dropping its range whole, ``reps`` rounds of each, on a
    history of ``days`` daily ranges; medians and every run."""
    if days < 2 * reps + 1:
        raise ValueError(f"{days} daily ranges cannot give {reps} rounds two ranges each")
    per_range = max(1, due // 100)
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(days=days + 1)
    runs: dict[str, list[dict[str, float]]] = {"by_row": [], "drop": []}
    with Scratch() as scratch:
        dsn = scratch.create("prune_rows")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, [])
            # daily ranges as `slawatch run` rotating daily leaves them: range 0 (made by
            # the migrate) then one per day, each closed at its day's end.
            spans: list[tuple[int, int]] = []
            for day in range(days):
                if day:  # forced (opened "1000 days from now"): the clock is in the past
                    conn.execute(
                        "SELECT slawatch.history_rotate(%s, interval '-1000 days')",
                        (start + timedelta(days=day),),
                    )
                (lo, hi) = conn.execute(
                    "SELECT row_low, row_high FROM slawatch.history_range WHERE n = %s", (day,)
                ).fetchone() or (0, 0)
                lo = max(int(lo), 1)
                load = {
                    "rule": rule_dict(1)["name"],
                    "start": start + timedelta(days=day),
                    "gap": timedelta(days=1) / per_range / 2,
                    "lo": lo,
                    "rows": per_range,
                }
                conn.execute(LOAD_ROWS, load)
                conn.execute(LOAD_SENDS, load)
                spans.append((lo, int(hi)))
            conn.execute("SELECT slawatch.history_rotate(%s, interval '-1000 days')", (now,))
            conn.execute("VACUUM ANALYZE slawatch.outbox_row, slawatch.outbox_send")
            size = conn.execute(
                "SELECT pg_total_relation_size('slawatch.outbox_row_h1')"
                " + pg_total_relation_size('slawatch.outbox_send_h1')"
            ).fetchone()
            cutoff = now - timedelta(hours=1)  # every loaded range past the window
            for r in range(reps):
                # Row by row: the oldest range's rows by prune_outbox_rows batches, as
                # prune_rows takes a range it must keep (and every row before 0026).
                n = 2 * r
                lo, hi = spans[n]
                conn.execute("CHECKPOINT")
                wal0, t, rows = lsn(conn), time.perf_counter(), 0
                while True:
                    with conn.transaction():
                        conn.execute("SET LOCAL jit = off")
                        got = conn.execute(
                            queries()["prune_outbox_rows"],
                            {"cutoff": cutoff, "batch": PRUNE_BATCH, "lo": lo, "hi": hi},
                        ).fetchone()
                    rows += int(got[0]) if got else 0
                    if not got or int(got[0]) < PRUNE_BATCH:
                        break
                by_row = {"secs": time.perf_counter() - t, "rows": rows, "wal": lsn(conn) - wal0}
                # Its emptied range is dropped untimed: the next drop takes a full one.
                conn.execute("SELECT * FROM slawatch.history_drop(%s)", (cutoff,))
                conn.execute("CHECKPOINT")
                wal0, t = lsn(conn), time.perf_counter()
                dropped = drop_range(conn, cutoff)
                drop = {
                    "secs": time.perf_counter() - t,
                    "ranges": dropped.ranges,
                    "wal": lsn(conn) - wal0,
                }
                if rows != per_range or dropped.ranges != 1:
                    raise RuntimeError(f"round {r + 1}: {rows} rows by row, {dropped.ranges} drops")
                runs["by_row"].append(by_row)
                runs["drop"].append(drop)
                print(f"  round {r + 1}: by row {by_row}, drop {drop}", file=log, flush=True)
    return {
        "due": due,
        "rows": per_range,
        "days": days,
        "range_mb": float(size[0]) / 1e6 if size and size[0] else 0.0,
        "by_row_ms": med([x["secs"] for x in runs["by_row"]]) * 1000,
        "by_row_wal": med([x["wal"] for x in runs["by_row"]]),
        "drop_ms": med([x["secs"] for x in runs["drop"]]) * 1000,
        "drop_wal": med([x["wal"] for x in runs["drop"]]),
        "runs": runs,
    }


def report_rows(res: dict[str, Any], reps: int) -> list[str]:
    """measure_rows()'s figures as printed lines."""
    return [
        f"PRUNING THE OUTBOX IN ROWS: a drain's worth, {res['due']:,} alerts in {res['rows']:,}"
        f" rows (one send each, sent; a range of {res['range_mb']:,.1f} MB), {res['days']}"
        f" daily ranges; {reps} rounds, medians",
        f"  row by row (prune_outbox_rows):  {res['by_row_ms']:8,.1f} ms, WAL"
        f" {res['by_row_wal'] / 1e6:,.2f} MB",
        f"  the range dropped (history_drop): {res['drop_ms']:8,.1f} ms, WAL"
        f" {res['drop_wal'] / 1e3:,.1f} kB",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=10_000_000, help="alerts of history")
    parser.add_argument("--rows", type=int, default=1_000_000, help="orders in the shop table")
    parser.add_argument("--due", type=int, default=50_000, help="orders each drain claims")
    parser.add_argument("--batch", type=int, default=10_000, help="the rule's claim batch")
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds (>= 3)")
    parser.add_argument("--days", type=float, default=10.0, help="the history spans this")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--outbox", choices=("alerts", "rows"), default="alerts", help="which outbox's history"
    )
    args = parser.parse_args()
    began = time.perf_counter()
    if args.outbox == "rows":
        rows = measure_rows(args.due, args.reps, int(args.days))
        print(json.dumps(rows) if args.json else "\n".join(report_rows(rows, args.reps)))
        return
    res = measure(args.alerts, args.rows, args.due, args.batch, args.reps, args.days)
    if args.json:
        print(json.dumps(res))
        return
    print("\n".join(report(res, args.days, args.batch, args.reps)))
    print(f"whole run: {time.perf_counter() - began:.0f} s; scratch database dropped")


if __name__ == "__main__":
    main()
