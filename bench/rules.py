"""How slawatch's own CPU grows with idle rules (issue 27, the rules curve).

N rules (100, 300 and 1,000 by default), each on a table of its own with 1,000
open rows none due for two days (bench/idle.py's), scanned ``every: 5s`` by
``slawatch run`` in a subprocess (rule files in a temporary folder, a console
notifier, no admin HTTP). Each count runs in turn, ``--reps`` times (interleaved:
100, 300, 1,000, 100, ...); each phase starts a fresh ``slawatch run``, lets it
warm up for ``--warm`` seconds after its startup line (reading the catalog for
1,000 rules takes a minute or more: not idle cost), then counts over a window of
``--seconds``:

- slawatch CPU %: the subprocess's utime + stime (``/proc/<pid>/stat``) per
  second of the window, in % of one core;
- database CPU %: the same for the server processes serving the scratch database
  (its backends in ``pg_stat_activity``), when the server runs on this machine
  (else not measured);
- statements per check: ``pg_stat_statements`` calls (transactions where the server
  has no ``pg_stat_statements``: see bench/idle.py) over the window, divided by the
  scans due in it (N × seconds / 5);
- connections: the most ``pg_stat_activity`` showed for the database.

Then whether the curve bends: each figure per rule at the largest count against
the smallest (1.0: linear; the goal allows 1.5). Medians of the reps.

``--against DIR``: another slawatch's source tree (e.g. ``git archive main | tar -x
-C DIR``), run in turn with this one in every phase (this, then that, per count and
rep: interleaved), its curve printed beside, with this one's CPU over that one's per
count. ``--database NAME``: the scratch database by that name, set up once and kept
(setting up 1,000 rules takes minutes; kept across runs on a server of
``SLAWATCH_BENCH_DSN``'s only); without it a new one is made and dropped.

    .venv/bin/python bench/rules.py [--counts 100,300,1000] [--seconds 30] [--warm 40]
                                    [--reps 3] [--every 5] [--against DIR]
                                    [--database NAME]

Without SLAWATCH_BENCH_DSN it starts a scratch PostgreSQL 15 cluster that loads
pg_stat_statements (bench/idle.py's counting_server).
"""

# ruff: noqa: RUF001, RUF002, RUF003
# (the output prints × on purpose)

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
import idle

from slawatch.db import with_database

COUNTS = (100, 300, 1_000)
EVERY = 5  # seconds between scans of each rule
# A phase's warm-up: the start (catalog reads for every rule), and enough scans of
# each rule for PostgreSQL to keep generic plans of its probe (5 runs on a connection).
WARM = 40.0
SECONDS = 30.0
# Per-rule cost at the largest count against the smallest above which the curve bends.
BENDS = 1.5


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime stime


def _backends(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    ).fetchall()
    return [int(r[0]) for r in rows]


def _local(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server's processes are this machine's (we can read their /proc)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        _ticks(int(row[0]) if row else 0)
    except (OSError, IndexError, ValueError):
        return False
    return True


@contextlib.contextmanager
def running(
    dsn: str, folder: Path, source: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``slawatch run`` on the rules of ``folder`` (the slawatch of the source tree
    ``source``, when given); stopped (SIGTERM) on the way out."""
    env = dict(
        os.environ,
        SLAWATCH_DSN=dsn,
        SLAWATCH_LOG_LEVEL="INFO",  # the startup line says when it runs; idle scans log nothing
        SLAWATCH_HTTP="",
    )
    if source is not None:
        # Ahead of the editable install of this tree.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(source), os.environ.get("PYTHONPATH", "")) if p
        )
    log = (folder / "run.log").open("w+")
    cmd = [sys.executable, "-m", "slawatch", "--rules", str(folder / "rules")]
    cmd += ["--notifiers", str(folder / "notifiers")]
    # Run from the rules' folder: `-m` puts the working directory first on the path.
    proc = subprocess.Popen(
        [*cmd, "run"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def phase(
    dsn: str,
    count: int,
    every: int,
    seconds: float,
    warm: float,
    statements: bool,
    source: Path | None = None,
) -> dict[str, float]:
    """One ``slawatch run`` of the first ``count`` rules (of the tree ``source``, when
    given): its CPU and the database's over the window."""
    tick = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="slawatch-rules-") as tmp:
        folder = Path(tmp)
        (folder / "rules").mkdir()
        (folder / "notifiers").mkdir()
        for i in range(count):
            written = idle.rule_dict(i, every=f"{every}s")
            name = written.pop("name")
            (folder / "rules" / f"{name}.yaml").write_text(json.dumps(written))
        (folder / "notifiers" / "console.yaml").write_text(json.dumps({"type": "console"}))
        with running(dsn, folder, source) as proc, psycopg.connect(dsn, autocommit=True) as conn:
            # The warm-up counts from the startup line: reading the catalog for a
            # thousand rules takes a while, and is not what an idle rule costs.
            deadline = None
            while deadline is None or time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"slawatch run exited ({proc.returncode}):"
                        f" {(folder / 'run.log').read_text()[-2000:]}"
                    )
                if deadline is None and " running: " in (folder / "run.log").read_text():
                    deadline = time.monotonic() + warm
                time.sleep(0.5)
            local = _local(conn)
            backends = _backends(conn) if local else []

            def server() -> dict[int, int]:
                got = {}
                for pid in backends:
                    with contextlib.suppress(OSError):
                        got[pid] = _ticks(pid)
                return got

            before = idle.snapshot(conn, statements)
            mine, theirs, began = _ticks(proc.pid), server(), time.monotonic()
            with idle.sampled_connections(dsn) as seen:
                time.sleep(seconds)
            mine_after, theirs_after = _ticks(proc.pid), server()
            took = time.monotonic() - began
            after = idle.snapshot(conn, statements)
            if proc.poll() is not None:
                raise RuntimeError(f"slawatch run exited ({proc.returncode}) in the window")
    counter = "statements" if statements else "transactions"
    checks = count * took / every
    out = {
        "slawatch_cpu": (mine_after - mine) / tick / took * 100,
        # Less the sampler's reads (and the snapshots'), which are transactions too.
        "per_check": (after[counter] - before[counter] - len(seen) - 2) / checks,
        "connections": float(max(seen, default=0) - 1),  # less the snapshot's
    }
    if local:
        used = sum(theirs_after[p] - theirs[p] for p in theirs if p in theirs_after)
        out["db_cpu"] = used / tick / took * 100
    return out


def measure(
    dsn: str,
    counts: tuple[int, ...] = COUNTS,
    seconds: float = SECONDS,
    reps: int = 3,
    warm: float = WARM,
    every: int = EVERY,
    against: Path | None = None,
    database: str | None = None,
) -> dict[str, Any]:
    """The curve on a scratch database of ``dsn``'s server: per count, the medians of
    ``reps`` interleaved phases (``slawatch_cpu``, ``db_cpu`` when measured, ``per_check``,
    ``connections``), and ``bend``: per-rule CPU at the largest count / at the smallest.

    ``against``: another slawatch's source tree, run after this one in each phase; its
    figures as ``against`` (the same keys), and ``ratio``: per count, this one's CPU
    over that one's (the median of the reps' ratios). ``database``: that scratch
    database, set up if it is not there, and kept."""
    name = database or f"slawatch_rules_{uuid.uuid4().hex[:8]}"
    db = with_database(dsn, name)
    with psycopg.connect(dsn, autocommit=True) as admin:
        there = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if there is None:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            statements = False
            with contextlib.suppress(psycopg.Error):
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")  # not preloaded: fails
                statements = idle._has_statements(conn)
            # A kept database: set up already (its rules' definitions recorded)?
            row = conn.execute(
                "SELECT to_regclass('slawatch.rule_generation') IS NOT NULL"
            ).fetchone()
            made = 0
            if row and row[0]:
                got = conn.execute("SELECT count(*) FROM slawatch.rule_generation").fetchone()
                made = int(got[0]) if got else 0
        if made < max(counts):
            if made:
                raise RuntimeError(f"database {name}: {made} rules set up, fewer than asked")
            idle.setup(db, max(counts), every=f"{every}s")
        variants: list[Path | None] = [None] if against is None else [None, against]
        runs: dict[tuple[int, int], list[dict[str, float]]] = {
            (v, n): [] for v in range(len(variants)) for n in counts
        }
        for _ in range(reps):
            for n in counts:
                for v, source in enumerate(variants):
                    runs[v, n].append(phase(db, n, every, seconds, warm, statements, source))
    finally:
        if database is None:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
    out = _curve({n: runs[0, n] for n in counts}, counts)
    out |= {"statements": statements, "every": every}
    if against is not None:
        out["against"] = _curve({n: runs[1, n] for n in counts}, counts)
        out["ratio"] = {
            n: statistics.median(
                a["slawatch_cpu"] / b["slawatch_cpu"]
                for a, b in zip(runs[0, n], runs[1, n], strict=True)
            )
            for n in counts
        }
    return out


def _curve(runs: dict[int, list[dict[str, float]]], counts: tuple[int, ...]) -> dict[str, Any]:
    """Per count the medians of its phases; the bends and the goal's ratio."""
    curve: dict[int, dict[str, float]] = {}
    for n, got in runs.items():
        curve[n] = {
            key: statistics.median(r[key] for r in got) for key in got[0] if key != "connections"
        }
        curve[n]["connections"] = max(r["connections"] for r in got)
    low, high = min(counts), max(counts)

    def per_rule(n: int, key: str) -> float:
        return curve[n][key] / n

    out: dict[str, Any] = {
        "curve": curve,
        "bend": per_rule(high, "slawatch_cpu") / per_rule(low, "slawatch_cpu"),
    }
    if "db_cpu" in curve[high]:
        out["db_bend"] = per_rule(high, "db_cpu") / per_rule(low, "db_cpu")
        # The goal: slawatch's own CPU at most the database's, at the most rules.
        out["cpu_ratio"] = curve[high]["slawatch_cpu"] / curve[high]["db_cpu"]
    return out


def report(m: dict[str, Any], seconds: float, reps: int) -> list[str]:
    """The curve as lines for people (and the other tree's, with ``--against``)."""
    count = "statements" if m["statements"] else "transactions (no pg_stat_statements)"
    lines = [
        f"RULES: N idle rules × every {m['every']}s under `slawatch run`; medians of {reps}"
        f" interleaved windows of {seconds:.0f} s; CPU in % of one core",
    ]
    curves = [("this tree", m)]
    if "against" in m:
        curves.append(("the other tree (--against)", m["against"]))
    for title, c in curves:
        if len(curves) > 1:
            lines.append(f"{title}:")
        lines += _curve_lines(c)
    if "ratio" in m:
        lines.append(
            "  slawatch CPU, this tree / the other (median of the reps' ratios): "
            + ", ".join(f"{n:,} rules {r:.2f}×" for n, r in m["ratio"].items())
        )
    lines.append(f"  {count} per check (a check: one rule's scan)")
    return lines


def _curve_lines(m: dict[str, Any]) -> list[str]:
    lines = [
        f"{'rules':>8}{'slawatch CPU':>14}{'DB CPU':>9}{'per check':>11}{'conns':>7}"
        f"{'slawatch/rule':>15}",
    ]
    for n, c in m["curve"].items():
        db = f"{c['db_cpu']:>8.2f}%" if "db_cpu" in c else f"{'-':>9}"
        lines.append(
            f"{n:>8,}{c['slawatch_cpu']:>13.2f}%{db}{c['per_check']:>11.2f}"
            f"{c['connections']:>7.0f}{c['slawatch_cpu'] / n * 1000:>12.2f} m%"
        )
    low, high = min(m["curve"]), max(m["curve"])
    bends = "bends" if m["bend"] > BENDS else "linear"
    lines.append(
        f"  slawatch CPU per rule at {high:,} vs {low:,}: {m['bend']:.2f}× ({bends};"
        f" 1.0 is linear, above {BENDS} bends)"
    )
    if "db_bend" in m:
        lines.append(f"  database CPU per rule at {high:,} vs {low:,}: {m['db_bend']:.2f}×")
        lines.append(
            f"  slawatch CPU vs the database's at {high:,} rules: {m['cpu_ratio']:.2f}× (goal ≤ 1)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default=",".join(str(n) for n in COUNTS))
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--warm", type=float, default=WARM)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--every", type=int, default=EVERY)
    parser.add_argument("--against", type=Path, default=None)
    parser.add_argument("--database", default=None)
    args = parser.parse_args()
    if args.against is not None and not (args.against / "slawatch" / "__init__.py").is_file():
        parser.error(f"--against {args.against}: not a slawatch source tree (no slawatch/)")
    counts = tuple(int(n) for n in args.counts.split(","))
    given = os.environ.get("SLAWATCH_BENCH_DSN")
    with contextlib.ExitStack() as stack:
        dsn = given or stack.enter_context(idle.counting_server())
        m = measure(
            dsn,
            counts,
            args.seconds,
            args.reps,
            args.warm,
            args.every,
            against=args.against,
            database=args.database,
        )
    print("\n".join(report(m, args.seconds, args.reps)))


if __name__ == "__main__":
    sys.exit(main())
