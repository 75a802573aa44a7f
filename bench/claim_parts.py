"""What the inline claim statement costs beyond the seed's raw claim, part by part.

bench/outbox_shapes.py's ``none, inline`` is slawatch's claim with no outbox at all;
this runs it beside the raw claim (bench/run.py's RAW) and beside copies of each with
one part taken out or added, so that each part's cost is the difference of two drains
of the same work:

- ``raw``: the seed's raw claim; ``raw+locks``: the same with ``FOR NO KEY UPDATE SKIP
  LOCKED`` on its two index reads (what slawatch locks the rows with);
- ``none``: slawatch's claim with no outbox (outbox_shapes' ``none``, this tree's);
- ``none-locks``: without the row locks (it would lose the guarantee that concurrent
  claims take disjoint batches and leave alone a row the application is updating);
- ``none-returning``: RETURNING the notification number alone, not the alert's content
  (key, episode, deadline, the row's data as jsonb) that an outbox writes;
- ``none-rowsub``: the row's data as ``to_jsonb`` of a sub-select row instead of
  ``jsonb_build_object`` (the same value; tried as a cheaper way to build it).

Each drain runs on a fresh copy of one loaded database (bench/run.py's orders: 1 M rows,
20 k due, batch 10 k), prepared and planned for its parameters as bench/run.py's SQL
variants are, in interleaved rounds whose order turns each round. Per variant: rows/s and
the server backend's CPU per claimed row (from /proc: the server must run on this
machine), medians, and each as a ratio to that round's raw claim. With ``--perf LABEL,...``
(root, ``perf`` installed) each named variant is drained ``--perf-rounds`` more times
under ``perf record -g`` after the timed rounds, and the CPU per row under each part of
the work is printed: a steadier
instrument on a noisy machine than CPU time, whose drains move by a third.

    SLAWATCH_BENCH_DSN=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/claim_parts.py [--rounds 7] [--perf raw,none] [--explain]
    .venv/bin/python bench/claim_parts.py --quick   # 20,000 rows, one round: does it run?

Every database it makes is dropped at the end. Not a test (docs/performance.md, "Where
inline's speed went").
"""

# ruff: noqa: RUF001
# (the output prints the multiplication sign on purpose)

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import outbox_shapes
import run as shop
from benchdb import Scratch
from claim_ab import cpu_seconds
from common import machine, med

from slawatch.config.rules import Rule
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare

_LOCK = "FOR NO KEY UPDATE SKIP LOCKED"
_RAW_READS = (
    "    SELECT ctid FROM orders WHERE paid_at < %(now)s::timestamptz - interval '48 hours'\n"
    "                              AND sw_raw_n = 0 AND (status = 'paid')\n"
    "    UNION ALL\n"
    "    SELECT ctid FROM orders WHERE sw_raw_next < %(now)s::timestamptz\n"
    "                              AND sw_raw_next IS NOT NULL AND (status = 'paid')\n"
)
# A locking clause is not allowed beside UNION: each read locks in a sub-select.
_RAW_READS_LOCKED = (
    "    SELECT ctid FROM (SELECT ctid FROM orders\n"
    "                       WHERE paid_at < %(now)s::timestamptz - interval '48 hours'\n"
    f"                         AND sw_raw_n = 0 AND (status = 'paid') {_LOCK}) f\n"
    "    UNION ALL\n"
    "    SELECT ctid FROM (SELECT ctid FROM orders WHERE sw_raw_next < %(now)s::timestamptz\n"
    f"                       AND sw_raw_next IS NOT NULL AND (status = 'paid') {_LOCK}) a\n"
)


def swap(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced; fails when ``old`` is not in it (the claim changed)."""
    if old not in text:
        sys.exit(f"claim_parts.py: the claim no longer reads {old[:60]!r}: update this bench")
    return text.replace(old, new)


def rule(batch: int) -> Rule:
    return Rule.model_validate(shop.rule_dict(batch, None))


def none_claim(conn: psycopg.Connection[Any], batch: int) -> tuple[str, Callable[..., Any]]:
    """slawatch's claim with no outbox (outbox_shapes' ``none``), as text, and its params."""
    with outbox_shapes.outbox_of("none"):
        plan = prepare(conn, rule(batch))
    return plan.statement.as_string(conn), plan.params


def variants(conn: psycopg.Connection[Any], batch: int) -> dict[str, str]:
    """Each variant's statement (the slawatch ones rendered on ``conn``)."""
    none, _ = none_claim(conn, batch)
    start = none.index("    RETURNING ", none.index("claimed AS ("))
    end = none.index("), alerts AS (")
    returning = none[start:end]
    row = returning[returning.index("jsonb_build_object(") :].rsplit(" AS row_data", 1)[0]
    columns = [c.split(", ")[0] for c in row[len("jsonb_build_object(") : -1].split("', ")[1:]]
    rowsub = f"(SELECT to_jsonb(r) FROM (SELECT {', '.join(columns)}) AS r)"
    n = returning.split(" AS episode, ", 1)[1].split(" AS n,", 1)[0]
    return {
        "raw": shop.RAW,
        "raw+locks": swap(shop.RAW, _RAW_READS, _RAW_READS_LOCKED),
        "none": none,
        "none-locks": swap(none, f"\n       {_LOCK}", ""),
        "none-returning": none[:start] + f"    RETURNING {n} AS n\n" + none[end:],
        "none-rowsub": swap(none, row, rowsub),
    }


# perf: each sample's part of the work, the first of these found in its stack.
PARTS = [
    ("row data (jsonb)", ("jsonb_build_object", "to_jsonb", "ExecSubPlan")),
    ("row locks", ("heap_lock_tuple",)),
    ("index entries", ("ExecInsertIndexTuples",)),
    ("heap update", ("heap_update",)),
    ("index reads", ("index_getnext_slot",)),
    ("CTE tuplestores", ("tuplestore_",)),
    ("planning", ("pg_plan_queries",)),
    ("commit", ("CommitTransactionCommand",)),
]


def perf_parts(path: str) -> Counter[str]:
    out = subprocess.run(
        ["perf", "script", "-i", path, "-F", "ip,sym"], capture_output=True, text=True
    ).stdout
    parts: Counter[str] = Counter()
    for sample in out.split("\n\n"):
        frames = [line.split(None, 1)[-1] for line in sample.strip().splitlines()]
        if not frames:
            continue
        part = next(
            (name for name, fns in PARTS if any(f.startswith(fns) for f in frames)), "the rest"
        )
        parts[part] += 1
    return parts


def walk(node: dict[str, Any], out: list[dict[str, Any]]) -> None:
    out.append(node)
    for child in node.get("Plans", []):
        walk(child, out)


def explain_once(dsn: str, text: str, params: dict[str, Any]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of one batch, rolled back: the statement, the update,
    the row locks (LockRows less the index scan under it), planning, WAL per row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        shop.prewarm(conn)
        os.sync()
        time.sleep(1.0)
        with conn.transaction(force_rollback=True):
            row = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + text,  # type: ignore[arg-type]
                params,
            ).fetchone()
    assert row is not None
    doc = row[0][0]
    nodes: list[dict[str, Any]] = []
    walk(doc["Plan"], nodes)
    update = max(
        (n for n in nodes if n["Node Type"] == "ModifyTable"), key=lambda n: n["Actual Rows"]
    )
    locks = sum(
        n["Actual Total Time"] - n["Plans"][0]["Actual Total Time"]
        for n in nodes
        if n["Node Type"] == "LockRows" and n["Actual Rows"] > 0
    )
    rows = max(update["Actual Rows"], 1)
    return (
        f"statement {doc['Execution Time']:4.0f} ms, update {update['Actual Total Time']:4.0f}"
        f" ms, locks {locks:4.1f} ms, planning {doc['Planning Time']:3.1f} ms;"
        f" WAL {doc['Plan'].get('WAL Bytes', 0) / rows:5,.0f} B,"
        f" {doc['Plan'].get('WAL Records', 0) / rows:4.1f} records a row"
    )


def drain_once(
    dsn: str, text: str, params: dict[str, Any], raw: bool, batch: int, perf: str | None
) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        shop.prewarm(conn)
        os.sync()  # the copy's files written back before, not during, the drain
        time.sleep(1.0)
        conn.execute("SET plan_cache_mode = force_custom_plan")
        pid = conn.info.backend_pid
        rec = None
        if perf:
            rec = subprocess.Popen(
                ["perf", "record", "-g", "-F", "2000", "-o", perf, "-p", str(pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        cpu0, t0, total = cpu_seconds(pid), time.perf_counter(), 0
        while True:
            cur = conn.execute(text, params, prepare=True)  # type: ignore[call-overload]
            got = len(cur.fetchall()) if raw else int(cur.fetchone()[0])
            total += got
            if got < batch:
                break
        secs, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
        if rec is not None:
            rec.send_signal(2)
            rec.wait()
    return {"alerts": total, "rate": total / secs, "cpu_us": cpu / max(total, 1) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--due", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="", help="comma-separated variants (raw always runs)")
    ap.add_argument("--perf", default="", help="comma-separated variants to sample with perf")
    ap.add_argument("--perf-rounds", type=int, default=3, help="sampled drains of each")
    ap.add_argument("--explain", action="store_true", help="then EXPLAIN one batch of each")
    ap.add_argument("--quick", action="store_true", help="20,000 rows, 2,000 due, batch 500")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.due, args.batch, args.rounds = 20_000, 2_000, 500, 1
    now = datetime.now(UTC).replace(microsecond=0)
    loads = [os.getloadavg()[0]]
    perfdir = tempfile.mkdtemp(prefix="claim_parts_")
    sampled: dict[str, Counter[str]] = {}
    sampled_rows: dict[str, int] = {}
    with Scratch() as scratch:
        with psycopg.connect(scratch.server, autocommit=True) as server:
            print(machine(server))
        scratch.create("base")
        shop.load_shop(scratch.dsn("base"), args.rows, args.due, now)
        scratch.create("raw", template="base")
        scratch.create("sw", template="base")
        with psycopg.connect(scratch.dsn("raw"), autocommit=True) as conn:
            conn.execute(shop.RAW_SETUP)
            conn.execute("VACUUM ANALYZE orders")
        with psycopg.connect(scratch.dsn("sw"), autocommit=True) as conn:
            migrate(conn, [rule(args.batch)])
            conn.execute("VACUUM ANALYZE orders")
            texts = variants(conn, args.batch)
            _, params_of = none_claim(conn, args.batch)
            sw_params = params_of(now)
        names = [n for n in texts if not args.only or n == "raw" or n in args.only.split(",")]
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        print(
            f"data: bench/run.py's orders, {args.rows:,} rows, {args.due:,} due, batch"
            f" {args.batch:,}; each drain on a fresh copy"
        )
        for r in range(args.rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                raw = name.startswith("raw")
                scratch.create("run", template="raw" if raw else "sw")
                try:
                    params = {"now": now, "batch": args.batch} if raw else sw_params
                    res = drain_once(scratch.dsn("run"), texts[name], params, raw, args.batch, None)
                finally:
                    scratch.drop("run")
                runs[name].append(res)
                loads.append(os.getloadavg()[0])
                print(
                    f"round {r + 1} {name:>15}: {res['rate']:8,.0f} rows/s"
                    f" {res['cpu_us']:6.1f} us CPU/row",
                    flush=True,
                )
        # Sampled drains after the timed ones (perf's own cost is in their CPU time).
        perfs = [n for n in args.perf.split(",") if n in names]
        for r in range(args.perf_rounds if perfs else 0):
            for name in perfs:
                raw = name.startswith("raw")
                scratch.create("run", template="raw" if raw else "sw")
                path = f"{perfdir}/{name}.{r}.data"
                try:
                    params = {"now": now, "batch": args.batch} if raw else sw_params
                    res = drain_once(scratch.dsn("run"), texts[name], params, raw, args.batch, path)
                finally:
                    scratch.drop("run")
                sampled.setdefault(name, Counter()).update(perf_parts(path))
                sampled_rows[name] = sampled_rows.get(name, 0) + int(res["alerts"])
        if args.explain:  # one batch each, three times, interleaved
            print("\nONE BATCH each (EXPLAIN ANALYZE, the first batch after a checkpoint):")
            for r in range(3):
                for name in names:
                    raw = name.startswith("raw")
                    scratch.create("run", template="raw" if raw else "sw")
                    try:
                        params = {"now": now, "batch": args.batch} if raw else sw_params
                        line = explain_once(scratch.dsn("run"), texts[name], params)
                    finally:
                        scratch.drop("run")
                    print(f"{r + 1} {name:>15}: {line}", flush=True)
    base = runs["raw"]
    print(
        f"\nmedians of {args.rounds} interleaved rounds; load average (1 min)"
        f" {min(loads):.1f}–{max(loads):.1f}"
    )
    print(
        "{:>15} {:>9} {:>7} {:>8} {:>7}".format("variant", "rows/s", "vs raw", "CPU us", "vs raw")
    )
    for name in names:
        rs = runs[name]
        rate = med([x["rate"] / y["rate"] for x, y in zip(rs, base, strict=True)])
        cpu = med([x["cpu_us"] / y["cpu_us"] for x, y in zip(rs, base, strict=True)])
        print(
            f"{name:>15} {med([x['rate'] for x in rs]):9,.0f} {rate:6.2f}×"
            f" {med([x['cpu_us'] for x in rs]):8.1f} {cpu:6.2f}×"
        )
    if sampled:
        print("\nperf samples per claimed row (2,000 a second: 0.5 ms each), by part of the work:")
        heads = list(sampled)
        print("{:>18} ".format("part") + " ".join(f"{n:>15}" for n in heads))
        for part in [p for p, _ in PARTS] + ["the rest", "total"]:
            cells = []
            for n in heads:
                count = sum(sampled[n].values()) if part == "total" else sampled[n][part]
                cells.append(f"{count * 500 / sampled_rows[n]:12.2f} us")
            print(f"{part:>18} " + " ".join(cells))
        print(
            f"(µs of CPU per row: samples × 0.5 ms over the rows of {args.perf_rounds} sampled"
            " drains each, after the timed ones; perf's own cost included)"
        )


if __name__ == "__main__":
    main()
