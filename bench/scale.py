"""How the claim's cost grows with the work (issue 27, the rows and backlog curves).

Two curves, on bench/run.py's shop table (``orders``, 16 columns, primary key + 7
business indexes) and with its building blocks (load_shop, add_due, the variants,
measure_drain):

- rows: for each table size (1 M, 3 M, 10 M rows by default) with the same --due
  rows overdue (20,000, in the newest band, 1 in 10, as bench/run.py loads them):
  the claim rate (rows/s) of slawatch ``track: inline``, ``track: table`` and the
  seed's raw claim, and the empty probe (one claim with nothing due, µs, median of
  200). The work is the same at every size: the curve should be flat.
- backlog: on one table size (the smallest of --rows), for each backlog (10 k,
  100 k, 1 M overdue orders by default, added on top of the table): the time to
  drain the whole backlog, and so rows/s. The work grows with the backlog, the time
  should grow as much: rows/s flat.

Each (size, variant) drains a fresh copy of the same database, as bench/run.py's
claim section does (CREATE DATABASE ... TEMPLATE, file copy; prewarmed and
checkpointed): --reps rounds, the variants' order rotating each round (interleaved
within a size; the sizes in turn, since each needs its own load); medians.

The verdict per curve and variant, as bench/rules.py's: the per-unit figure (rows/s;
the probe's µs) at the biggest size against the smallest. A rate worse than 1/1.5 of
the smallest's (a probe slower than 1.5×) bends. Why 1.5: run to run, the same drain
on this shared 2-core machine varies by 10-30 %, and a real bend is a growth with the
work (the event probe's Seq Scan: 10× the time at 10× the timers); 1.5× over a 10×
size separates the two, and is bench/rules.py's tolerance too.

Duration on this 2-core machine (PostgreSQL 15, shared: load average 3-8): loading
1 M rows takes 13-20 s, 3 M 33 s, 10 M 214 s (3.3 GB; each size is loaded on its own:
growing one table would write as many rows, into live indexes); a file copy of 1 M
rows ~5 s, of 10 M ~30 s, and each size takes 3 + 3 × --reps copies. Measured:
rows 1 M 49 s, 3 M 85 s; backlog 10 k 37 s, 100 k 152 s (--reps 3). Estimated for
the default run: rows ~2.5 min + ~10 min at 10 M; backlog ~15 min (the 1 M drains,
3 variants × 3 rounds): ~30 minutes. Elapsed time per part is printed at the end.
--quick: small sizes, one round (~40 s-2 min: does it run?).

    .venv/bin/python bench/scale.py                                   # 1/3/10 M rows; 10 k/100 k/1 M due
    .venv/bin/python bench/scale.py --rows 1000000,3000000 --due 10000,100000
    .venv/bin/python bench/scale.py --quick
    .venv/bin/python bench/scale.py --json                            # the figures as JSON

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
Every database it makes is dropped at the end.
"""

# ruff: noqa: RUF001, RUF002, RUF003, E501
# (the output prints × and µs on purpose)

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run
from benchdb import Scratch
from common import machine, med

ROWS = (1_000_000, 3_000_000, 10_000_000)
BACKLOG = (10_000, 100_000, 1_000_000)
DUE = 20_000  # overdue rows at every table size of the rows curve
QUICK_ROWS = (50_000, 200_000)
QUICK_BACKLOG = (1_000, 10_000)
QUICK_DUE = 2_000
QUICK_BATCH = 500
NAMES = ("inline", "table", "raw")  # the seed's raw claim: the reference
# A per-unit figure at the biggest size worse than this many times the smallest's bends.
BENDS = 1.5


def _variants(names: tuple[str, ...]) -> list[run.Variant]:
    return [v for v in run.variants() if v.name in names and not v.skipped]


def _curve_point(
    scratch: Scratch,
    base: str,
    vs: list[run.Variant],
    batch: int,
    reps: int,
    now: datetime,
    log: Any,
) -> dict[str, list[dict[str, float]]]:
    """Each variant set up on a copy of ``base``; then ``reps`` rounds, the variants'
    order rotating, each draining a fresh copy of its set-up copy: every run."""
    runs: dict[str, list[dict[str, float]]] = {v.name: [] for v in vs}
    for v in vs:
        scratch.create(f"scale_{v.name}", template=base)
        with psycopg.connect(scratch.dsn(f"scale_{v.name}"), autocommit=True) as conn:
            v.setup(conn, batch)  # type: ignore[misc]
            conn.execute("VACUUM ANALYZE orders")
    for r in range(reps):
        for v in vs[r % len(vs) :] + vs[: r % len(vs)]:
            scratch.create("scale_run", template=f"scale_{v.name}")
            try:
                m = run.measure_drain(scratch.dsn("scale_run"), v, batch, now, 1e9)
            finally:
                scratch.drop("scale_run")
            runs[v.name].append(m)
            print(
                f"    round {r + 1} {v.name}: {m['rows']:,.0f} rows in {m['secs']:.2f} s"
                f" ({m['rate']:,.0f}/s), probe {m['probe_us']:,.0f} µs",
                file=log,
                flush=True,
            )
    for v in vs:
        scratch.drop(f"scale_{v.name}")
    return runs


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "rate": med([x["rate"] for x in runs]),
        "rates": [x["rate"] for x in runs],
        "secs": med([x["secs"] for x in runs]),
        "rows": med([x["rows"] for x in runs]),
        "probe_us": med([x["probe_us"] for x in runs]),
        "probe_unprepared_us": med([x["probe_unprepared_us"] for x in runs]),
    }


def _bend(curve: dict[int, dict[str, dict[str, Any]]], key: str, name: str) -> float:
    """``key`` at the biggest size / at the smallest, for variant ``name``."""
    low, high = min(curve), max(curve)
    return float(curve[high][name][key] / curve[low][name][key])


def measure(
    dsn_or_scratch: str | Scratch | None = None,
    rows_sizes: tuple[int, ...] | None = None,
    due_sizes: tuple[int, ...] | None = None,
    batch: int = 10_000,
    reps: int = 3,
    quick: bool = False,
    due: int | None = None,
    backlog_rows: int | None = None,
    names: tuple[str, ...] = NAMES,
    log: Any = sys.stderr,
) -> dict[str, Any]:
    """Both curves on scratch databases (of ``dsn_or_scratch``: a server DSN, a
    :class:`Scratch`, or None for SLAWATCH_BENCH_DSN's). ``rows_sizes``: the table
    sizes of the rows curve, each with ``due`` overdue; ``due_sizes``: the backlogs,
    on a table of ``backlog_rows`` (default: the smallest of ``rows_sizes``). Either
    may be empty: that curve is skipped. ``quick``: small defaults (does it run?).

    Returns ``rows`` and ``backlog`` (size -> variant -> medians: rate, secs, rows,
    probe_us, ...), ``rows_bend`` / ``backlog_bend`` (variant -> rows/s at the biggest
    size over the smallest: 1.0 flat, below 1/BENDS bent), ``probe_bend`` (variant ->
    probe µs at the most rows over the fewest), ``rows_ratio`` / ``backlog_ratio``
    (the worst of slawatch's variants), and ``secs`` (elapsed per part)."""
    if rows_sizes is None:
        rows_sizes = QUICK_ROWS if quick else ROWS
    if due_sizes is None:
        due_sizes = QUICK_BACKLOG if quick else BACKLOG
    if due is None:
        due = QUICK_DUE if quick else DUE
    if quick:
        batch = min(batch, QUICK_BATCH)
    rows_sizes, due_sizes = tuple(sorted(rows_sizes)), tuple(sorted(due_sizes))
    if backlog_rows is None:
        backlog_rows = min(rows_sizes) if rows_sizes else (QUICK_ROWS if quick else ROWS)[0]
    owned = not isinstance(dsn_or_scratch, Scratch)
    scratch = dsn_or_scratch if isinstance(dsn_or_scratch, Scratch) else Scratch()
    if isinstance(dsn_or_scratch, str):
        scratch.server = dsn_or_scratch
    vs = _variants(names)
    now = datetime.now(UTC).replace(microsecond=0)
    out: dict[str, Any] = {
        "rows": {},
        "backlog": {},
        "due": due,
        "batch": batch,
        "reps": reps,
        "backlog_rows": backlog_rows,
        "variants": [v.name for v in vs],
        "secs": {},
        "load_secs": {},
    }
    try:
        for size in rows_sizes:
            t = time.perf_counter()
            print(f"  rows curve: {size:,} rows, {due:,} due", file=log, flush=True)
            scratch.create("scale_base")
            loaded = run.load_shop(scratch.dsn("scale_base"), size, due, now)
            out["load_secs"][f"rows {size}"] = loaded
            print(f"    loaded in {loaded:.0f} s", file=log, flush=True)
            runs = _curve_point(scratch, "scale_base", vs, batch, reps, now, log)
            scratch.drop("scale_base")
            out["rows"][size] = {name: _summary(rs) for name, rs in runs.items()}
            out["secs"][f"rows {size:,}"] = time.perf_counter() - t
        if due_sizes:
            t = time.perf_counter()
            # The table without overdue rows; each backlog is added on top of a copy of
            # it, due during the minute before ``now`` (bench/run.py's add_due).
            scratch.create("scale_shop")
            loaded = run.load_shop(scratch.dsn("scale_shop"), backlog_rows, 0, now)
            out["load_secs"][f"backlog table {backlog_rows}"] = loaded
            out["secs"]["backlog table"] = time.perf_counter() - t
            for backlog in due_sizes:
                t = time.perf_counter()
                print(
                    f"  backlog curve: {backlog:,} due on {backlog_rows:,} rows",
                    file=log,
                    flush=True,
                )
                scratch.create("scale_base", template="scale_shop")
                with psycopg.connect(scratch.dsn("scale_base"), autocommit=True) as conn:
                    run.add_due(conn, backlog_rows + 1, backlog, now)
                    conn.execute("VACUUM ANALYZE orders")
                runs = _curve_point(scratch, "scale_base", vs, batch, reps, now, log)
                scratch.drop("scale_base")
                for name, rs in runs.items():
                    if any(x["rows"] != backlog for x in rs):
                        raise RuntimeError(
                            f"{name} drained {[x['rows'] for x in rs]} of a backlog of {backlog:,}"
                        )
                out["backlog"][backlog] = {name: _summary(rs) for name, rs in runs.items()}
                out["secs"][f"backlog {backlog:,}"] = time.perf_counter() - t
            scratch.drop("scale_shop")
    finally:
        if owned:
            scratch.__exit__(None, None, None)
    ours = [n for n in out["variants"] if n in ("inline", "table")]
    for curve in ("rows", "backlog"):
        if len(out[curve]) > 1:
            out[f"{curve}_bend"] = {n: _bend(out[curve], "rate", n) for n in out["variants"]}
            out[f"{curve}_ratio"] = min(out[f"{curve}_bend"][n] for n in ours) if ours else None
    if len(out["rows"]) > 1:
        out["probe_bend"] = {n: _bend(out["rows"], "probe_us", n) for n in out["variants"]}
    return out


def verdict(ratio: float, slower_is_higher: bool = False) -> str:
    """Flat or bends, for a per-unit figure's biggest/smallest ratio."""
    bent = ratio > BENDS if slower_is_higher else ratio < 1 / BENDS
    return "bends" if bent else "flat"


def _columns(
    label: str,
    points: dict[int, dict[str, dict[str, float]]],
    names: list[str],
    *columns: tuple[str, str, int, str],
) -> list[str]:
    """A curve's table: a size per line, then for each of ``columns`` (the figure's key,
    its heading after the variant's name, width, format) one column per variant."""
    lines = [
        f"{label:>12} "
        + " ".join(" ".join(f"{n + title:>{w}}" for n in names) for _, title, w, _ in columns)
    ]
    for size, point in points.items():
        lines.append(
            f"{size:>12,} "
            + " ".join(
                " ".join(f"{point[n][key]:>{w}{fmt}}" for n in names) for key, _, w, fmt in columns
            )
        )
    return lines


def report(res: dict[str, Any]) -> list[str]:
    """The two curves as printed lines (bench/run.py prints these too)."""
    lines: list[str] = []
    names = res["variants"]
    reps = res["reps"]
    if res["rows"]:
        lines.append(
            f"ROWS CURVE: {res['due']:,} overdue rows at every table size, batch"
            f" {res['batch']:,}; claim rows/s and the empty probe (prepared; raw: custom"
            f" plans), medians of {reps} interleaved runs"
        )
        lines += _columns(
            "rows",
            res["rows"],
            names,
            ("rate", " rows/s", 14, ",.0f"),
            ("probe_us", " probe µs", 16, ",.0f"),
        )
        if "rows_bend" in res:
            low, high = min(res["rows"]), max(res["rows"])
            for n in names:
                b, p = res["rows_bend"][n], res["probe_bend"][n]
                lines.append(
                    f"  {n}: rows/s at {high:,} rows vs {low:,}: {b:.2f}× ({verdict(b)});"
                    f" probe {p:.2f}× ({verdict(p, True)})"
                )
        lines.append("")
    if res["backlog"]:
        lines.append(
            f"BACKLOG CURVE: drain a whole backlog on a {res['backlog_rows']:,}-row table"
            f" (the backlog added on top), batch {res['batch']:,}; seconds and rows/s,"
            f" medians of {reps} interleaved runs"
        )
        lines += _columns(
            "backlog",
            res["backlog"],
            names,
            ("secs", " s", 10, ",.2f"),
            ("rate", " rows/s", 14, ",.0f"),
        )
        if "backlog_bend" in res:
            low, high = min(res["backlog"]), max(res["backlog"])
            for n in names:
                b = res["backlog_bend"][n]
                lines.append(
                    f"  {n}: rows/s at a backlog of {high:,} vs {low:,}: {b:.2f}× ({verdict(b)})"
                )
        lines.append("")
    lines.append(
        f"(flat: the figure per unit of work at the biggest size within {BENDS}× of the"
        " smallest's; bends: worse)"
    )
    lines.append("elapsed: " + ", ".join(f"{k} {v:.0f} s" for k, v in res["secs"].items()))
    return lines


def sizes(text: str) -> tuple[int, ...]:
    return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=sizes, default=None, help="table sizes (rows curve)")
    parser.add_argument("--due", type=sizes, default=None, help="backlogs (backlog curve)")
    parser.add_argument(
        "--rows-due", type=int, default=None, help=f"overdue rows at every size ({DUE:,})"
    )
    parser.add_argument(
        "--backlog-rows",
        type=int,
        default=None,
        help="the backlog curve's table (the fewest --rows)",
    )
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=None, help="interleaved rounds (3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (~1-2 min)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    began = time.perf_counter()
    with Scratch() as scratch:
        with psycopg.connect(scratch.server, autocommit=True) as server:
            print(machine(server), file=sys.stderr if args.json else sys.stdout, flush=True)
        res = measure(
            scratch,
            args.rows,
            args.due,
            args.batch,
            reps,
            args.quick,
            due=args.rows_due,
            backlog_rows=args.backlog_rows,
        )
    if args.json:
        print(json.dumps(res))
        return
    print("\n".join(report(res)))
    print(
        f"whole run: {time.perf_counter() - began:.0f} s, load average"
        f" {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs); scratch databases dropped"
    )


if __name__ == "__main__":
    main()
