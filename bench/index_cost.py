"""What each outbox index entry costs the inline claim: one database per variant (a copy
of one loaded shop, migrated by this tree, then the variant's SQL, e.g. one index
dropped), drained side by side one batch at a time (every variant's batch k runs
within a second of the others', in an order that turns each cycle), so that a shared
machine's load falls on all of them alike. Per batch: the server backend's CPU (from
/proc: the server must run on this machine). Printed: medians of the per-batch ratios
to the first variant, the ratio of the drains' total CPU, and the first variant's
outbox index bytes per alert after its drain.

    SLAWATCH_BENCH_DSN=... .venv/bin/python bench/index_cost.py \\
        [--rows 300000] [--due 40000] [--batch 2000] \\
        [--variant LABEL=SQL ...]

Without ``--variant``: this tree's outbox with each of its indexes dropped in turn
(docs/performance.md, "Where the rest goes").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# INDEX_COST_TREE: the slawatch tree to measure (e.g. a worktree of main); else this one.
sys.path.insert(0, os.environ.get("INDEX_COST_TREE") or str(HERE.parent))

import claim_ab  # noqa: E402
import run as shop  # noqa: E402

claim_ab.PREFIX = "sw_ic_"  # not claim_ab.py's databases: both may run on one server

from slawatch.config.rules import Rule  # noqa: E402
from slawatch.engine.claim import batches  # noqa: E402
from slawatch.engine.migrate import migrate  # noqa: E402
from slawatch.engine.ready import prepare  # noqa: E402

DEFAULT = {
    "all": "",
    "-delivery_id": "DROP INDEX slawatch.delivery_id",
    "-alert_rule_fired": "DROP INDEX slawatch.alert_rule_fired",
    "-episode_due": "DROP INDEX slawatch.episode_due",
    "-delivery_due": "DROP INDEX slawatch.delivery_due",
    "-alert_once": "DROP INDEX slawatch.alert_h0_once",
    "-alert_pkey": "ALTER TABLE slawatch.alert DROP CONSTRAINT alert_pkey",
    "-delivery_once": "ALTER TABLE slawatch.delivery DROP CONSTRAINT delivery_once",
}


SIZES = """\
SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'slawatch' AND c.relkind = 'i'
   AND c.relname ~ '^(alert|delivery|episode)' ORDER BY 1"""


def drop(dsn: str, name: str) -> None:
    with claim_ab.admin(dsn) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(claim_ab.PREFIX + name))
        )


def med(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--due", type=int, default=40_000)
    ap.add_argument("--batch", type=int, default=2_000)
    ap.add_argument("--variant", action="append", default=[], help="LABEL=SQL")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or DEFAULT
    dsn = claim_ab.server_dsn()
    now = datetime.now(UTC).replace(microsecond=0)
    rule = Rule.model_validate(shop.rule_dict(args.batch))
    claim_ab.recreate(dsn, "base", None)
    shop.load_shop(claim_ab.db_dsn(dsn, "base"), args.rows, args.due, now)
    names = {label: f"v{i}" for i, label in enumerate(variants)}
    conns: dict[str, psycopg.Connection[Any]] = {}
    steps = {}
    try:
        for label, extra in variants.items():
            for name in (names[label],):
                claim_ab.recreate(dsn, name, "base")
                conn = psycopg.connect(claim_ab.db_dsn(dsn, name), autocommit=True)
                migrate(conn, [rule])
                if extra:
                    conn.execute(extra)
                conn.execute("VACUUM ANALYZE orders")
                claim_ab.prewarm(conn)
                plan = prepare(conn, rule)
                conns[label] = conn
                steps[label] = batches(conn, plan, now)
        cpu: dict[str, list[float]] = {label: [] for label in variants}
        wall: dict[str, list[float]] = {label: [] for label in variants}
        order = list(variants)
        done: set[str] = set()
        k = 0

        while len(done) < len(order):
            turn = order[k % len(order) :] + order[: k % len(order)]
            for label in turn:
                if label in done:
                    continue
                pid = conns[label].info.backend_pid
                c0, t0 = claim_ab.cpu_seconds(pid), time.perf_counter()
                got = steps[label]()
                t1 = time.perf_counter()
                if got:
                    cpu[label].append((claim_ab.cpu_seconds(pid) - c0) / got * 1e6)
                    wall[label].append((t1 - t0) / got * 1e6)
                if got < args.batch:
                    done.add(label)
            k += 1
        sizes = conns[order[0]].execute(SIZES).fetchall()
        alerts = conns[order[0]].execute("SELECT count(*) FROM slawatch.alert").fetchone()
    finally:
        for conn in conns.values():
            conn.close()
        for name in names.values():
            drop(dsn, name)
        drop(dsn, "base")
    first = order[0]
    n = min(len(cpu[label]) for label in order)
    print(
        f"\n{args.rows:,} rows, {args.due:,} due, batch {args.batch:,}; {n} batches each;"
        f" load average {os.getloadavg()}"
    )
    print(
        "{:>18} {:>8} {:>8} {:>9} {:>8} {:>9}".format(
            "variant", "CPU us", "vs all", "wall us", "vs all", "total CPU"
        )
    )
    out = {}
    for label in order:
        rc = med([a / b for a, b in zip(cpu[label][:n], cpu[first][:n], strict=True)])
        tot = sum(cpu[label][:n]) / sum(cpu[first][:n])
        rw = med([a / b for a, b in zip(wall[label][:n], wall[first][:n], strict=True)])
        print(
            f"{label:>18} {med(cpu[label]):8.1f} {rc:7.3f}x {med(wall[label]):9.1f}"
            f" {rw:7.3f}x {tot:8.3f}x"
        )
        out[label] = {
            "cpu_us": med(cpu[label]),
            "cpu_ratio": rc,
            "cpu_total_ratio": tot,
            "wall_ratio": rw,
        }
    n_alerts = int(alerts[0]) if alerts else 0
    print(f"\nindex bytes per alert ({order[0]}, {n_alerts:,} alerts):")
    for name, size in sizes:
        print(f"{name:>44} {size / max(n_alerts, 1):8.1f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
