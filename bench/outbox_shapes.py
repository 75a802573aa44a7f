"""The lean outbox, measured before it is built: what leaner outbox shapes would make
of the claim, beside the seed's raw claim and slawatch's claim + outbox of today.

On bench/run.py's shop table (1 M orders, 20 k overdue, batch 10 k) each variant
drains a fresh copy of one loaded database (CREATE DATABASE ... TEMPLATE, prewarmed,
checkpointed), in interleaved rounds whose order turns each round:

- ``raw``: the seed's raw claim (bench/run.py's RAW), no outbox;
- ``today inline`` / ``today table``: slawatch's claim + outbox, as bench/run.py runs them;
- prototypes, each slawatch's own claim (the same UPDATE of the shop's rows for
  ``inline``, of the state table for ``table``, rendered by this tree) with its outbox
  CTEs swapped for a leaner shape written here, into tables of a scratch schema
  ``shapes`` partitioned by id range as slawatch's outbox is:

  - ``none``: no outbox at all (it would lose every alert): the claim's own tracking
    write alone, the ceiling no outbox shape can pass;
  - ``A``: one alert row per alert that carries its deliveries' state (arrays, one
    element per notifier), no delivery rows; the episode history as today;
  - ``B``: one outbox row per claimed batch (keys, episodes, n, deadlines, severities
    and the rows' data as arrays, lz4-compressed: jsonb_agg and pglz cost 4 µs an
    alert where array_agg and lz4 cost 1), no per-alert rows; episode history as
    today;
  - ``B100``: B cut into rows of 100 alerts, a delivery batch's worth (one lease, one
    send and one settle per row, as a queue has one row per job);
  - ``C``: B with the episode history folded in (the opened episodes are the batch's
    n = 1 entries; the ended ones an array of keys): no per-alert row at all;
  - ``C100``: C in rows of 100 alerts.

Per variant: rows/s, the server backend's CPU per alert (from /proc/<pid>/stat: the
server must run on this machine), WAL per alert (the drain's own records, read back
with pg_walinspect and kept to this database's blocks and transactions, so other
sessions on a shared server do not count; the cluster's LSN difference beside it),
rows written per alert (pg_stat_user_tables) and outbox bytes per alert (heap,
TOAST and indexes of slawatch's and the scratch schema's tables); then each shape's
ratio to the raw claim against issue 27's goals. PGQueuer's WAL per job is the
table of record's (docs/performance.md), not measured here.

    SLAWATCH_BENCH_DSN=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/outbox_shapes.py [--rounds 5] [--only today,none,C] [--explain]
    .venv/bin/python bench/outbox_shapes.py --quick     # 20,000 rows, one round: does it run?

Every database it makes is dropped at the end. Not a test: the figures depend on the
machine; compare the rows of one run (docs/performance.md, "The lean outbox: shapes
measured").
"""

# ruff: noqa: RUF001
# (the output prints the multiplication sign on purpose)

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as shop
from benchdb import Scratch
from claim_ab import cpu_seconds
from common import machine, med

import slawatch.engine.claim as claim_module
import slawatch.engine.outbox as outbox_module
import slawatch.engine.statetable as statetable_module
from slawatch.config.rules import Rule
from slawatch.engine.claim import batches
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare

# PGQueuer's WAL per job (its run + enqueue) in the table of record (docs/performance.md):
# WAL bytes hardly depend on the machine's load; the goal is 0.2x of it.
PGQUEUER_WAL = 2_854

# ---------------------------------------------------------------- the shapes' tables

# Partitioned by id range as slawatch's outbox is (0015_rotate.sql): retention drops a
# range. One range here, made with its own unique index where the shape has one.
SHAPES_DDL = """
CREATE SCHEMA shapes;

-- A: one row per alert, its deliveries' state in it (one array element per notifier).
CREATE TABLE shapes.alert_a (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    rule             text        NOT NULL,
    key              text        NOT NULL,
    episode          integer     NOT NULL,
    n                integer     NOT NULL,
    severity         text        NOT NULL,
    deadline         timestamptz,
    due_at           timestamptz,
    fired_at         timestamptz NOT NULL,
    row_data         jsonb       NOT NULL,
    kind             text        NOT NULL DEFAULT 'firing',
    notifiers        text[]      NOT NULL,
    status           text[]      NOT NULL,   -- per notifier: pending | sent | dead | ...
    attempts         integer[]   NOT NULL,
    pending          smallint    NOT NULL,   -- deliveries still pending; 0 leaves alert_a_due
    next_attempt_at  timestamptz,            -- the earliest pending delivery's
    lease_owner      uuid,
    lease_expires_at timestamptz,
    last_error       text[],
    sent_at          timestamptz[],
    summary_id       bigint[],
    PRIMARY KEY (id)
) PARTITION BY RANGE (id);
CREATE INDEX alert_a_rule_fired ON shapes.alert_a (rule, fired_at);
CREATE INDEX alert_a_due ON shapes.alert_a (next_attempt_at) WHERE pending > 0;
-- fillfactor 40 as slawatch.delivery's: room for a leased version (a HOT lease).
CREATE TABLE shapes.alert_a_h0 PARTITION OF shapes.alert_a
    FOR VALUES FROM (0) TO (4294967296) WITH (fillfactor = 40);
CREATE UNIQUE INDEX alert_a_h0_once ON shapes.alert_a_h0 (rule, key, episode, n);

-- B (and B100, C): one row per claimed batch (or per chunk of it) and notifier set.
CREATE TABLE shapes.batch (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    rule             text          NOT NULL,
    fired_at         timestamptz   NOT NULL,
    kind             text          NOT NULL DEFAULT 'firing',
    alerts           integer       NOT NULL,
    keys             text[]        COMPRESSION lz4 NOT NULL,
    episodes         integer[]     COMPRESSION lz4 NOT NULL,
    ns               integer[]     COMPRESSION lz4 NOT NULL,
    severities       text[]        COMPRESSION lz4 NOT NULL,
    deadlines        timestamptz[] COMPRESSION lz4 NOT NULL,  -- due_at: deadline + after
    row_data         jsonb[]       COMPRESSION lz4 NOT NULL,  -- one element per alert
    ended_keys       text[]        COMPRESSION lz4,  -- C: the keys whose episode ended
    notifiers        text[]        NOT NULL,
    status           text[]        NOT NULL,  -- per notifier, for the whole row
    attempts         integer[]     NOT NULL,
    pending          smallint      NOT NULL,
    next_attempt_at  timestamptz,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    last_error       text[],
    sent_at          timestamptz[],
    PRIMARY KEY (id)
) PARTITION BY RANGE (id);
CREATE INDEX batch_rule_fired ON shapes.batch (rule, fired_at);
CREATE INDEX batch_due ON shapes.batch (next_attempt_at) WHERE pending > 0;
CREATE TABLE shapes.batch_h0 PARTITION OF shapes.batch
    FOR VALUES FROM (0) TO (4294967296) WITH (fillfactor = 40);
"""

# The episode history's CTEs exactly as slawatch writes them (engine/outbox.py), for the
# shapes that keep it: the text of slawatch's outbox from its history on.
_HISTORY_AT = "), history_opened AS ("
HISTORY = _HISTORY_AT + outbox_module._OUTBOX.split(_HISTORY_AT, 1)[1]

# none: no outbox at all, the claim's own tracking write alone (it would lose every
# alert): the ceiling that no outbox shape can pass.
SHAPE_NONE = """\
), alerts AS (
    SELECT c.n, {severity} AS severity FROM claimed c
), deliveries AS (
    SELECT 1 FROM alerts
)"""

SHAPE_A = """\
), alerts AS (
    -- One row per alert with its deliveries: no delivery rows.
    INSERT INTO shapes.alert_a (rule, key, episode, n, severity, deadline, due_at, fired_at,
                                row_data, notifiers, status, attempts, pending,
                                next_attempt_at)
    SELECT %(rule)s, c.key, c.episode, c.n, {severity}, c.deadline,
           c.deadline + %(after)s::interval, %(now)s::timestamptz, c.row_data,
           x.notify, array_fill('pending'::text, ARRAY[cardinality(x.notify)]),
           array_fill(0, ARRAY[cardinality(x.notify)]), cardinality(x.notify),
           %(now)s::timestamptz
      FROM claimed c CROSS JOIN LATERAL (SELECT {notify} AS notify
                                           FROM (SELECT c.n) AS a(n)) x
    ON CONFLICT DO NOTHING
    RETURNING id, n, severity
), deliveries AS (
    SELECT 1 FROM alerts
"""

# The batch (or each chunk of {chunk} alerts of it), by notifier set (escalation tiers
# may page other notifiers by n). {ended}: C's keys of the episodes this claim ended.
_BATCH = """\
), outbox_rows AS (
    INSERT INTO shapes.batch (rule, fired_at, alerts, keys, episodes, ns, severities,
                              deadlines, row_data, ended_keys, notifiers, status, attempts,
                              pending, next_attempt_at)
    SELECT %(rule)s, %(now)s::timestamptz, count(*), array_agg(g.key), array_agg(g.episode),
           array_agg(g.n), array_agg(g.severity), array_agg(g.deadline),
           array_agg(g.row_data), {ended_first}, g.notify,
           array_fill('pending'::text, ARRAY[cardinality(g.notify)]),
           array_fill(0, ARRAY[cardinality(g.notify)]), cardinality(g.notify),
           %(now)s::timestamptz
      FROM (SELECT c.key, c.episode, c.n, c.deadline, c.row_data, {severity} AS severity,
                   x.notify, (row_number() OVER () - 1) / {chunk} AS part
              FROM claimed c CROSS JOIN LATERAL (SELECT {notify} AS notify
                                                   FROM (SELECT c.n) AS a(n)) x) g
     GROUP BY g.part, g.notify{ended_alone}
    RETURNING id, alerts, severities, notifiers
), alerts AS (
    SELECT o.id, s.severity FROM outbox_rows o, unnest(o.severities) AS s(severity)
), deliveries AS (
    SELECT 1 FROM outbox_rows o, unnest(o.notifiers) WHERE o.alerts > 0
"""
# C: the ended episodes' keys ride on the batch's first row, or alone when nothing was
# claimed (a batch that only closed episodes).
_ENDED_FIRST = "CASE WHEN g.part = 0 THEN ARRAY({closed}) END"
_ENDED_ALONE = """
    UNION ALL
    SELECT %(rule)s, %(now)s::timestamptz, 0, '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}',
           ARRAY({closed}), '{{}}', '{{}}', '{{}}', 0, NULL
     WHERE NOT EXISTS (SELECT 1 FROM claimed) AND EXISTS ({closed})"""


def shape_outbox(shape: str) -> Callable[..., sql.Composed]:
    """An ``outbox()`` of engine/outbox.py's signature writing ``shape``'s rows."""

    def outbox(
        severity: sql.Composable,
        notify: sql.Composable,
        acting: bool = False,
        *,
        closed: sql.Composable,
    ) -> sql.Composed:
        history = sql.SQL(HISTORY).format(
            superseded=sql.SQL(outbox_module._HISTORY_END).format(
                keys=sql.SQL("SELECT c.key FROM claimed c WHERE c.n = 1 AND c.episode > 1")
            ),
            ended=outbox_module.history_ended(closed),
        )
        if shape == "none":
            return sql.SQL(SHAPE_NONE).format(severity=severity)
        if shape == "A":
            return sql.Composed(
                [sql.SQL(SHAPE_A).format(severity=severity, notify=notify), history]
            )
        chunk = sql.SQL("100" if shape.endswith("100") else "%(batch)s::integer")
        if shape.startswith("C"):  # no episode rows: closed keys on the row; the CTEs end here
            body = sql.SQL(_BATCH).format(
                severity=severity,
                notify=notify,
                chunk=chunk,
                ended_first=sql.SQL(_ENDED_FIRST).format(closed=closed),
                ended_alone=sql.SQL(_ENDED_ALONE).format(closed=closed),
            )
            return sql.Composed([body, sql.SQL(")")])
        body = sql.SQL(_BATCH).format(
            severity=severity,
            notify=notify,
            chunk=chunk,
            ended_first=sql.SQL("NULL"),
            ended_alone=sql.SQL(""),
        )
        return sql.Composed([body, history])

    return outbox


@contextmanager
def outbox_of(shape: str) -> Iterator[None]:
    """slawatch's claims composed with ``shape``'s outbox while inside."""
    saved = claim_module.outbox, statetable_module.outbox
    claim_module.outbox = statetable_module.outbox = shape_outbox(shape)  # type: ignore[assignment]
    try:
        yield
    finally:
        claim_module.outbox, statetable_module.outbox = saved


# ---------------------------------------------------------------- the variants


def prototype(shape: str, track: str | None) -> shop.Variant:
    name = f"{shape} {'table' if track == 'table' else 'inline'}"

    def rule(batch: int) -> Rule:
        return Rule.model_validate(shop.rule_dict(batch, track))

    def setup(conn: psycopg.Connection[Any], batch: int) -> None:
        migrate(conn, [rule(batch)])
        conn.execute(SHAPES_DDL)

    def stepper(conn: psycopg.Connection[Any], batch: int, now: datetime) -> Callable[[], int]:
        with outbox_of(shape):
            plan = prepare(conn, rule(batch))
        return batches(conn, plan, now)

    today = shop.slawatch_variant(track)

    def explain(conn: psycopg.Connection[Any], batch: int, now: datetime) -> Any:
        with outbox_of(shape):
            return today.explain(conn, batch, now)  # type: ignore[misc]

    return shop.Variant(name, name, None, setup, stepper, explain)


def today(track: str | None) -> shop.Variant:
    v = shop.slawatch_variant(track)
    v.name = v.label = f"today {'table' if track == 'table' else 'inline'}"
    return v


SHAPES = ("none", "A", "B", "B100", "C", "C100")


def all_variants() -> list[shop.Variant]:
    raw = shop.sql_variant("raw", "raw", shop.RAW_SETUP, shop.RAW)
    out = [raw, today(None), today("table")]
    for shape in SHAPES:
        out += [prototype(shape, None), prototype(shape, "table")]
    return out


# ---------------------------------------------------------------- one drain

# The drain's own WAL: records on this database's blocks, and the records (commits)
# of the transactions that wrote them. Other sessions on the server do not count.
OWN_WAL = """
WITH r AS (SELECT xid, record_length, block_ref
             FROM pg_get_wal_records_info(%(a)s::pg_lsn, %(b)s::pg_lsn)),
ours AS (SELECT DISTINCT xid FROM r WHERE block_ref LIKE %(like)s AND xid <> '0')
SELECT coalesce(sum(record_length) FILTER (WHERE block_ref LIKE %(like)s
                                             OR xid IN (SELECT xid FROM ours)), 0)
  FROM r"""

WRITES = """
SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0) FROM pg_stat_user_tables
 WHERE schemaname IN ('public', 'slawatch', 'shapes')"""

OUTBOX_BYTES = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname IN ('slawatch', 'shapes') AND c.relkind = 'r'"""

COUNT = {
    "today": "SELECT count(*) FROM slawatch.alert",
    "A": "SELECT count(*) FROM shapes.alert_a",
    "B": "SELECT coalesce(sum(alerts), 0) FROM shapes.batch",
}


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def writes(conn: psycopg.Connection[Any]) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # flushed as this backend goes idle
    time.sleep(0.05)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(one(conn, WRITES))


def drain_once(dsn: str, v: shop.Variant, batch: int, now: datetime) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        shop.prewarm(conn)
        step = v.stepper(conn, batch, now)  # type: ignore[misc]
        dboid = one(conn, "SELECT oid FROM pg_database WHERE datname = current_database()")
        pid = conn.info.backend_pid
        w0, b0 = writes(conn), int(one(conn, OUTBOX_BYTES))
        lsn0 = one(conn, "SELECT pg_current_wal_lsn()")
        cpu0 = cpu_seconds(pid)
        total, times, secs = shop.drain(step, batch, 600.0)
        cpu = cpu_seconds(pid) - cpu0
        lsn1 = one(conn, "SELECT pg_current_wal_lsn()")
        # pg_walinspect reads up to the flushed WAL (an asynchronous commit may lag).
        while not one(conn, "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (lsn1,)):
            time.sleep(0.01)
        cluster = int(one(conn, "SELECT %s::pg_lsn - %s::pg_lsn", (lsn1, lsn0)))
        own = int(one(conn, OWN_WAL, {"a": lsn0, "b": lsn1, "like": f"% 1663/{dboid}/%"}))
        rows = writes(conn) - w0
        grown = int(one(conn, OUTBOX_BYTES)) - b0
        kind = v.name.split()[0]
        if kind not in ("raw", "none"):
            stored = int(one(conn, COUNT[kind if kind in COUNT else "B"]))
            if stored != total:
                sys.exit(f"{v.name}: {total:,} alerts claimed but {stored:,} in its outbox")
    n = max(total, 1)
    return {
        "alerts": total,
        "rate": total / secs if secs else 0.0,
        "ms_batch": med(times) * 1000,
        "cpu_us": cpu / n * 1e6,
        "wal": own / n,
        "cluster_wal": cluster / n,
        "rows": rows / n,
        "bytes": grown / n,
    }


# ---------------------------------------------------------------- the run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--due", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 3 for medians)")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated: raw, today, none, A, B, B100, C, C100 (raw always runs)",
    )
    ap.add_argument(
        "--explain",
        action="store_true",
        help="then EXPLAIN (ANALYZE, BUFFERS, WAL) one batch of each variant (bench/run.py's"
        " explain: its writes, WAL and index entries per alert)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="20,000 rows, 2,000 due, batch 500, one round"
    )
    args = ap.parse_args()
    if args.quick:
        args.rows, args.due, args.batch, args.rounds = 20_000, 2_000, 500, 1
    variants = all_variants()
    if args.only:
        keep = {w.strip() for w in args.only.split(",")} | {"raw"}
        variants = [v for v in variants if v.name.split()[0] in keep]
    now = datetime.now(UTC).replace(microsecond=0)
    began = time.perf_counter()
    loads = [os.getloadavg()[0]]
    with Scratch() as scratch:
        with psycopg.connect(scratch.server, autocommit=True) as server:
            print(machine(server))
        scratch.create("base")
        loaded = shop.load_shop(scratch.dsn("base"), args.rows, args.due, now)
        with psycopg.connect(scratch.dsn("base"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_walinspect")
        print(
            f"data: bench/run.py's orders, {args.rows:,} rows, {args.due:,} overdue, batch"
            f" {args.batch:,}; loaded in {loaded:.0f} s; each drain on a fresh copy"
        )
        for v in variants:
            scratch.create(f"t{variants.index(v)}", template="base")
            with psycopg.connect(scratch.dsn(f"t{variants.index(v)}"), autocommit=True) as conn:
                v.setup(conn, args.batch)  # type: ignore[misc]
                conn.execute("VACUUM ANALYZE orders")
        for r in range(args.rounds):
            k = r % len(variants)
            for v in variants[k:] + variants[:k]:
                scratch.create("run", template=f"t{variants.index(v)}")
                try:
                    res = drain_once(scratch.dsn("run"), v, args.batch, now)
                finally:
                    scratch.drop("run")
                v.runs.append(res)
                loads.append(os.getloadavg()[0])
                print(
                    f"round {r + 1} {v.name:>12}: {res['rate']:8,.0f} alerts/s"
                    f" {res['cpu_us']:6.1f} us CPU {res['wal']:7,.0f} B WAL /alert",
                    flush=True,
                )
        explained: list[str] = []
        if args.explain:  # one batch each, on a fresh copy: the first batch of a drain
            for v in variants:
                scratch.create("run", template=f"t{variants.index(v)}")
                try:
                    explained += shop.explain_batch(scratch.dsn("run"), v, args.batch, now)
                finally:
                    scratch.drop("run")
    raw = variants[0]
    print(
        f"\nmedians of {args.rounds} interleaved rounds; {time.perf_counter() - began:.0f} s;"
        f" load average (1 min) {min(loads):.1f}–{max(loads):.1f}"
    )
    head = (
        "variant", "alerts/s", "vs raw", "CPU us", "vs raw", "WAL B", "vs PGQ", "cluster",
        "rows", "outbox B",
    )  # fmt: skip
    print("{:>12} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>5} {:>8}".format(*head))
    for v in variants:
        rs = v.runs
        rate = med([x["rate"] / y["rate"] for x, y in zip(rs, raw.runs, strict=True)])
        cpu = med([x["cpu_us"] / y["cpu_us"] for x, y in zip(rs, raw.runs, strict=True)])
        wal = med([x["wal"] for x in rs])
        print(
            f"{v.name:>12} {med([x['rate'] for x in rs]):9,.0f} {rate:6.2f}× "
            f"{med([x['cpu_us'] for x in rs]):7.1f} {cpu:6.2f}× {wal:7,.0f} "
            f"{wal / PGQUEUER_WAL:6.2f}× {med([x['cluster_wal'] for x in rs]):8,.0f} "
            f"{med([x['rows'] for x in rs]):5.2f} {med([x['bytes'] for x in rs]):8,.0f}"
        )
    print(
        "\nalerts/s vs raw: the median of each round's ratio to that round's raw claim."
        f" Goals (issue 27): table ≥ 2.5×, inline ≥ 0.95×; WAL ≤ 0.2× PGQueuer's"
        f" {PGQUEUER_WAL:,} B/job (≤ {0.2 * PGQUEUER_WAL:,.0f} B). rows: rows inserted or"
        " updated per alert (shop, state and outbox tables); outbox B: growth of slawatch's"
        " and the shapes' tables (heap, TOAST, indexes) per alert."
    )
    if explained:
        print("\nONE BATCH each (EXPLAIN ANALYZE; a node's time includes the CTEs it reads):")
        print("\n".join(explained))


if __name__ == "__main__":
    main()
