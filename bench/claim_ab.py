"""Inline claim of two or more slawatch trees side by side, interleaved with the seed's
raw claim: bench/run.py's shop table and rule, one drain per variant on a fresh copy
of one loaded database, and per claimed row the server backend's CPU (read from
/proc, the server must run on this machine) and WAL besides rows/s.

    SLAWATCH_BENCH_DSN=... .venv/bin/python bench/claim_ab.py \\
        [--rows 1000000] [--due 20000] [--batch 10000] [--rounds 3] \\
        [--tree LABEL=PATH ...] [--sql LABEL=SQL ...] [--explain]

Each ``--tree`` is a slawatch source tree (a ``git worktree`` of an older commit): its
variant runs in a child process with that tree first on ``PYTHONPATH``, so one venv
serves every tree whose dependencies it has. Without ``--tree``: this tree alone.
``--sql LABEL=SQL`` runs SQL in that variant's database after ``migrate`` (one tree
given twice under two labels, one with an index dropped: what that index costs).
Used to find where ``track: inline`` lost its speed (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent
PREFIX = "sw_ab_"


def server_dsn() -> str:
    dsn = os.environ.get("SLAWATCH_BENCH_DSN") or os.environ.get("SLAWATCH_DSN")
    if not dsn:
        sys.exit("claim_ab.py: set SLAWATCH_BENCH_DSN (a server on this machine)")
    return dsn


def db_dsn(dsn: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=PREFIX + name)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a local process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def prewarm(conn: psycopg.Connection[Any]) -> None:
    """As bench/run.py: orders and its indexes read once, then a checkpoint."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
    conn.execute(
        "SELECT pg_prewarm(c.oid) FROM pg_class c WHERE c.oid = 'orders'::regclass"
        " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'orders'::regclass)"
    )
    conn.execute("CHECKPOINT")


# ---------------------------------------------------------------- one variant (child)


def run_variant(dsn: str, kind: str, batch: int, now: datetime, explain: bool) -> dict[str, Any]:
    # bench/run.py's statements and rule, by value: run.py imports more of slawatch than
    # an older tree may have.
    shop = json.loads(os.environ["CLAIM_AB_SHOP"])
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        if kind == "raw":
            conn.execute(shop["raw_setup"])
            conn.execute("SET plan_cache_mode = force_custom_plan")
            params = {"now": now, "batch": batch}

            def step() -> int:
                return len(conn.execute(shop["raw"], params, prepare=True).fetchall())

            statement: Any = sql.SQL(shop["raw"])
        else:
            import slawatch

            try:
                from slawatch.config.rules import Rule
                from slawatch.engine.claim import batches
                from slawatch.engine.migrate import migrate
                from slawatch.engine.ready import prepare
            except ImportError:  # the layout before the stage subpackages (2026-11-25)
                from slawatch.claim import batches, prepare  # type: ignore[no-redef]
                from slawatch.migrate import migrate  # type: ignore[no-redef]
                from slawatch.rules import Rule  # type: ignore[no-redef]

            rule = Rule.model_validate(shop["rule"])
            migrate(conn, [rule])
            if os.environ.get("CLAIM_AB_SQL"):  # --sql: e.g. one outbox index dropped
                conn.execute(os.environ["CLAIM_AB_SQL"])
            plan = prepare(conn, rule)
            step = batches(conn, plan, now)
            statement, params = plan.statement, plan.params(now)
            out["tree"] = str(Path(slawatch.__file__).parent.parent)
        # As bench/run.py: statistics of the tracking columns too (without them the
        # planner prices the partial indexes blind).
        if not os.environ.get("CLAIM_AB_NO_ANALYZE"):
            conn.execute("VACUUM ANALYZE orders")
        prewarm(conn)
        pid = conn.info.backend_pid
        if explain:
            with conn.transaction(force_rollback=True):
                row = conn.execute(
                    sql.SQL("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) {}").format(statement),
                    params,
                ).fetchone()
            # Alone on its copy: the rolled-back batch leaves dead rows behind.
            return {"explain": row[0] if row else None, **out}
        wal0, cpu0, t0 = lsn(conn), cpu_seconds(pid), time.perf_counter()
        total, times = 0, []
        while True:
            t = time.perf_counter()
            got = step()
            times.append(time.perf_counter() - t)
            total += got
            if got < batch:
                break
        secs = time.perf_counter() - t0
        cpu, wal = cpu_seconds(pid) - cpu0, lsn(conn) - wal0
        idx = conn.execute(
            "SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname IN ('public', 'slawatch')"
        ).fetchone()
    out.update(
        rows=total,
        secs=secs,
        rate=total / secs,
        ms_batch=sorted(times)[len(times) // 2] * 1000,
        cpu_us=cpu / total * 1e6 if total else float("nan"),
        wal_b=wal / total if total else float("nan"),
        idx_bytes=int(idx[0]) if idx else 0,
    )
    return out


# ---------------------------------------------------------------- orchestration


def admin(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def recreate(dsn: str, name: str, template: str | None) -> None:
    with admin(dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(PREFIX + name)))
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PREFIX + name))
        if template:
            create = sql.SQL("{} TEMPLATE {} STRATEGY FILE_COPY").format(
                create, sql.Identifier(PREFIX + template)
            )
        conn.execute(create)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--due", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], help="LABEL=PATH of a slawatch tree")
    ap.add_argument(
        "--sql",
        action="append",
        default=[],
        help="LABEL=SQL run after migrate in that tree's variant (e.g. DROP INDEX ...)",
    )
    ap.add_argument("--explain", action="store_true", help="EXPLAIN one batch of each, first")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # kind db now
    args = ap.parse_args()
    dsn = server_dsn()
    if args.child:
        kind, db, now = args.child
        result = run_variant(
            db_dsn(dsn, db), kind, args.batch, datetime.fromisoformat(now), args.explain
        )
        print(json.dumps(result, default=str))
        return
    sys.path.insert(0, str(HERE))
    import run as shop

    shop_json = json.dumps(
        {"raw_setup": shop.RAW_SETUP, "raw": shop.RAW, "rule": shop.rule_dict(args.batch)}
    )
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(HERE.parent)]]
    extra = dict(t.split("=", 1) for t in args.sql)
    now = datetime.now(UTC).replace(microsecond=0)
    t = time.perf_counter()
    recreate(dsn, "base", None)
    shop.load_shop(db_dsn(dsn, "base"), args.rows, args.due, now)
    print(f"loaded {args.rows:,} rows, {args.due:,} due in {time.perf_counter() - t:.0f} s")
    variants = [("raw", str(HERE.parent))] + [(label, path) for label, path in trees]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v, _ in variants}
    plan = [(-1, v) for v in variants] if args.explain else []
    for r in range(args.rounds):
        plan += [(r, v) for v in (variants if r % 2 == 0 else variants[::-1])]
    for r, (label, path) in plan:
        if True:
            recreate(dsn, "run", "base")
            env = dict(os.environ, PYTHONPATH=path, CLAIM_AB_SHOP=shop_json)
            env.pop("CLAIM_AB_SQL", None)
            if label in extra:
                env["CLAIM_AB_SQL"] = extra[label]
            cmd = [sys.executable, __file__]
            kind = "raw" if label == "raw" else "slawatch"
            cmd += ["--batch", str(args.batch), "--child", kind, "run", now.isoformat()]
            if r < 0:
                cmd.append("--explain")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{label}: {proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            if kind != "raw" and Path(res["tree"]).resolve() != Path(path).resolve():
                sys.exit(f"{label}: ran the slawatch of {res['tree']}, not {path}")
            if r < 0:
                out = Path(f"/tmp/claim_ab_explain_{label}.json")
                out.write_text(json.dumps(res["explain"], indent=1))
                print(f"explain {label:>14}: {out}")
                continue
            runs[label].append(res)
            print(
                f"round {r + 1} {label:>14}: {res['rate']:8,.0f} rows/s"
                f" {res['ms_batch']:6.0f} ms/batch  {res['cpu_us']:5.1f} us CPU/row"
                f"  {res['wal_b']:6,.0f} B WAL/row",
                flush=True,
            )
    recreate(dsn, "run", None)

    def med(xs: list[float]) -> float:
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    raw = runs["raw"]
    print(f"\nmedians of {args.rounds}, {args.rows:,} rows, {args.due:,} due, batch {args.batch:,}")
    # WAL/row: the cluster's WAL over the drain (other sessions' too on a shared server;
    # --explain gives one batch's own).
    head = ("variant", "rows/s", "vs raw", "CPU/row", "vs raw", "WAL/row")
    print("{:>14} {:>8} {:>7} {:>8} {:>7} {:>8}".format(*head))
    for label, _ in variants:
        rs = runs[label]
        # Per round against the raw run of the same round, then the median of those.
        rate = med([x["rate"] / y["rate"] for x, y in zip(rs, raw, strict=True)])
        cpu = med([x["cpu_us"] / y["cpu_us"] for x, y in zip(rs, raw, strict=True)])
        print(
            f"{label:>14} {med([x['rate'] for x in rs]):8,.0f} {rate:6.2f}x"
            f" {med([x['cpu_us'] for x in rs]):6.1f}us {cpu:6.2f}x"
            f" {med([x['wal_b'] for x in rs]):7,.0f}B"
        )


if __name__ == "__main__":
    main()
