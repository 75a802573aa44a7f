"""What slawatch costs the database while nothing happens (issue 18, row "idle").

100 rules (one table each, 1,000 open rows, none due for two days) scanned every
second by ``slawatch run`` in this process (a :class:`Runner` with a console
notifier), beside the raw probes: per rule and second, one prepared
``SELECT 1 ... LIMIT 1`` on the rule's first-notice partial index, on one
connection (what a hand-written poller would send). With ``--track table`` the
rules are ``track: table`` and the raw probe reads their due index
(``paid_at < cutoff AND status = 'paid'``: no tracking column on the table).
The two take turns, ``seconds`` each, three times (medians of the interleaved
runs), on one scratch database.

How it counts, per scratch database:

- statements, DB time (execution + planning) and WAL bytes: ``pg_stat_statements``
  (its ``calls``, ``total_exec_time + total_plan_time``, ``wal_bytes``), which needs
  ``shared_preload_libraries``: without ``SLAWATCH_BENCH_DSN`` the benchmark starts a
  scratch PostgreSQL 15 cluster of its own that loads it (the machine's
  ``/usr/lib/postgresql/15``). A server without it: statements are then counted as
  transactions, DB time as ``pg_stat_database.active_time``, and WAL is not measured.
- transactions and rows written: ``pg_stat_database`` (``xact_commit +
  xact_rollback``; ``tup_inserted + tup_updated + tup_deleted``), the snapshot's and
  the sampler's own transactions taken off.
- connections: the most ``pg_stat_activity`` showed for the database during the
  phase, sampled every 0.1 s.

A cycle is one second (both run one a second): the counters' change over a window
of ``seconds``, opened once the load has run for ``--warm`` seconds (75 for slawatch,
at most 15 for the raw probes: see WARM), divided by its seconds. Counters in ``pg_stat_database``
reach it when a backend flushes them (about once a second for a busy one), so those
figures are good to a cycle or so per window; ``pg_stat_statements`` counts at once.

    .venv/bin/python bench/idle.py [--rules 100] [--seconds 10] [--reps 3]
                                   [--pooler auto|none|transaction] [--warm 75]
                                   [--track inline|table] [--top N]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from slawatch.config.notifiers import ConsoleConfig
from slawatch.config.rules import Rule
from slawatch.db import Pooler, with_database
from slawatch.engine.migrate import migrate
from slawatch.runtime.scheduler import Runner

ROWS = 1_000  # open rows per table, none due
PG15 = Path("/usr/lib/postgresql/15/bin")


def rule_dict(i: int, track: str = "inline", every: str = "1s") -> dict[str, Any]:
    """Rule ``i`` as a rule file says it (with its name, which a file takes from its own)."""
    return {
        "name": f"idle{i:03}",
        "track": track,
        "table": f"public.w{i:03}",
        "key": "id",
        "deadline": "paid_at",
        "after": "48h",
        "open_when": "status = 'paid'",
        "every": every,
        "renotify": {"every": "6h", "max": 5},
        "columns": ["id", "paid_at"],
        "notify": ["console"],
    }


def rule(i: int, track: str = "inline", every: str = "1s") -> Rule:
    return Rule.model_validate(rule_dict(i, track, every))


def setup(dsn: str, rules: int, track: str = "inline", every: str = "1s") -> list[Rule]:
    """``rules`` tables and rules, migrated; every row paid a moment ago (due in 48 h)."""
    made = [rule(i, track, every) for i in range(rules)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Thousands of small DDL transactions: not one flush each (a scratch database).
        conn.execute("SET synchronous_commit = off")
        for r in made:
            t = sql.Identifier(r.table_name)
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id bigint PRIMARY KEY, status text NOT NULL,"
                    " paid_at timestamptz NOT NULL)"
                ).format(t)
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT g, 'paid', now() - g * interval '1 second'"
                    " FROM generate_series(1, %s) g"
                ).format(t),
                (ROWS,),
            )
        migrate(conn, made)
        conn.execute("VACUUM ANALYZE")
    return made


# ---------------------------------------------------------------- counting


def _has_statements(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
    ).fetchone()
    return bool(row and row[0])


def snapshot(conn: psycopg.Connection[Any], statements: bool) -> dict[str, float]:
    """The database's counters now (this connection's own reads left out)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted,"
        " active_time FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    out = {"transactions": float(row[0]), "writes": float(row[1]), "active_ms": float(row[2])}
    if statements:
        got = conn.execute(
            "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time + total_plan_time), 0),"
            " coalesce(sum(wal_bytes), 0) FROM pg_stat_statements s"
            " JOIN pg_database d ON d.oid = s.dbid AND d.datname = current_database()"
            " WHERE s.userid = (SELECT oid FROM pg_roles WHERE rolname = current_user)"
            " AND query NOT LIKE '%pg_stat%'"
        ).fetchone()
        assert got is not None
        out |= {"statements": float(got[0]), "db_ms": float(got[1]), "wal": float(got[2])}
    return out


@contextlib.contextmanager
def sampled_connections(conn_dsn: str) -> Iterator[list[int]]:
    """The number of other connections to the database, every 0.1 s while inside."""
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(conn_dsn, autocommit=True) as c:
            while not stop.wait(0.1):
                row = c.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                ).fetchone()
                seen.append(int(row[0]) if row else 0)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


# --top N: the N statements with the most DB time in each slawatch window, printed.
TOP = 0


def by_statement(conn: psycopg.Connection[Any]) -> dict[int, tuple[float, float, float, str]]:
    """pg_stat_statements per queryid: calls, planning ms, execution ms, the text."""
    rows = conn.execute(
        "SELECT queryid, calls, total_plan_time, total_exec_time, query FROM pg_stat_statements s"
        " JOIN pg_database d ON d.oid = s.dbid AND d.datname = current_database()"
        " WHERE query NOT LIKE '%pg_stat%'"
    ).fetchall()
    return {int(q): (float(c), float(p), float(e), str(t)) for q, c, p, e, t in rows}


def print_top(
    who: str,
    before: dict[int, tuple[float, float, float, str]],
    after: dict[int, tuple[float, float, float, str]],
    seconds: float,
) -> None:
    """The TOP statements by DB time over the window, per second, to stderr."""
    rows = []
    for q, (calls, plan, execute, text) in after.items():
        c0, p0, e0, _ = before.get(q, (0.0, 0.0, 0.0, ""))
        rows.append(
            (
                (plan - p0 + execute - e0) / seconds,
                (calls - c0) / seconds,
                (plan - p0) / seconds,
                " ".join(text.split())[:90],
            )
        )
    rows.sort(reverse=True)
    print(f"  {who}: top statements (ms/s, calls/s, of it planning ms/s):", file=sys.stderr)
    for db_ms, calls, plan, text in rows[:TOP]:
        print(f"  {db_ms:7.2f} {calls:7.1f} {plan:7.2f}  {text}", file=sys.stderr)


def window(dsn: str, statements: bool, seconds: float, top: str = "") -> dict[str, float]:
    """The counters' change per second over ``seconds`` while the load runs beside
    (with --top: its costliest statements printed, headed ``top``)."""
    top = top if statements and TOP > 0 else ""
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = by_statement(conn) if top else {}
        before = snapshot(conn, statements)
        with sampled_connections(dsn) as seen:
            time.sleep(seconds)
        after = snapshot(conn, statements)
        if top:
            print_top(top, first, by_statement(conn), seconds)
    per = {k: (after[k] - before[k]) / seconds for k in after}
    # The snapshot's own reads and the sampler's are transactions of the database too.
    per["transactions"] -= (2 + len(seen)) / seconds
    if not statements:
        per["statements"], per["db_ms"] = per["transactions"], per["active_ms"]
    per["connections"] = float(max(seen, default=0) - 1)  # less the snapshot's
    return per


# Seconds the load runs before the window opens: slawatch's start (catalog reads,
# settling orphans, LISTEN) is not idle cost, nor is its warming up. With prepared
# statements (--pooler auto on a direct connection, or none) PostgreSQL plans each of
# 100 rules' probes once on each pooled connection (a statement without parameters is
# generic from its first run), done within 45 s; until 2026-11-28 the probe took the
# cutoffs as parameters and was planned 5 times more, which took 100-110 s (1.7 ms/s of
# planning still at 75 s). The window opens after that and before the scans' records
# are written again (a minute after the first, then every minute): 60-70 s would hold
# those writes. The pool may grow by a connection then, whose first run of each probe
# plans it (0.5 ms each, about 100 in the next 30 s): a window can still hold some.
WARM = 75.0
# The raw probes' warming up: psycopg prepares each at its 6th run, PostgreSQL keeps a
# generic plan after 5 more; one connection, one run a second.
RAW_WARM = 15.0


def slawatch_phase(
    dsn: str, rules: list[Rule], seconds: float, statements: bool, pooler: Pooler, warm: float
) -> dict[str, float]:
    runner = Runner(dsn, rules, [ConsoleConfig(name="console", type="console")], pooler=pooler)
    serving = threading.Thread(target=runner.serve, daemon=True)
    try:
        serving.start()
        time.sleep(warm)
        return window(dsn, statements, seconds, top="slawatch")
    finally:
        runner.stop()
        serving.join()
        runner.close()


def raw_phase(
    dsn: str, rules: list[Rule], seconds: float, statements: bool, warm: float
) -> dict[str, float]:
    probes = [
        sql.SQL(
            "SELECT 1 FROM {t} WHERE paid_at < %s AND {seen} IS DISTINCT FROM paid_at"
            " AND (status = 'paid') LIMIT 1"
        ).format(t=sql.Identifier(r.table_name), seen=sql.Identifier(r.seen_column))
        if r.track == "inline"
        # track: table: no tracking column on the table; its due index answers.
        else sql.SQL("SELECT 1 FROM {t} WHERE paid_at < %s AND (status = 'paid') LIMIT 1").format(
            t=sql.Identifier(r.table_name)
        )
        for r in rules
    ]
    stop = threading.Event()

    def probing() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            start = time.monotonic()
            cycles = 0
            while not stop.is_set():
                cutoff = datetime.now(UTC) - timedelta(hours=48)
                for probe in probes:
                    conn.execute(probe, (cutoff,)).fetchall()
                cycles += 1
                stop.wait(max(0.0, start + cycles - time.monotonic()))

    thread = threading.Thread(target=probing, daemon=True)
    try:
        thread.start()
        time.sleep(warm)
        return window(dsn, statements, seconds, top="the raw probes")
    finally:
        stop.set()
        thread.join()


def measure(
    dsn: str,
    rules: int = 100,
    seconds: float = 10.0,
    reps: int = 3,
    pooler: Pooler = "auto",
    warm: float = WARM,
    track: str = "inline",
) -> dict[str, float]:
    """slawatch's idle cost against the raw probes', per cycle, on a scratch database of
    ``dsn``'s server: ratios and slawatch's own figures (medians of ``reps`` interleaved
    runs). ``pooler``: slawatch's SLAWATCH_POOLER (``auto``, the default: prepared
    statements on the connections proven direct, which these are; ``none``: prepared
    statements without looking; ``transaction``: nothing prepared, as behind a
    pooler); ``track``: the rules' ``track``."""
    name = f"slawatch_idle_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    db = with_database(dsn, name)
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            statements = False
            with contextlib.suppress(psycopg.Error):
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")  # not preloaded: fails
                # DB time is planning + execution: an unprepared probe's cost is mostly
                # planning, which the server leaves out unless told (every new session
                # of this database is).
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET pg_stat_statements.track_planning = on").format(
                        sql.Identifier(name)
                    )
                )
                statements = _has_statements(conn)
        made = setup(db, rules, track)
        runs: dict[str, list[dict[str, float]]] = {"slawatch": [], "raw": []}
        for _ in range(reps):
            runs["slawatch"].append(slawatch_phase(db, made, seconds, statements, pooler, warm))
            runs["raw"].append(raw_phase(db, made, seconds, statements, min(warm, RAW_WARM)))
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def med(who: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[who])

    out = {
        "rules": float(rules),
        "statements": med("slawatch", "statements"),
        "raw_statements": med("raw", "statements"),
        "transactions": med("slawatch", "transactions"),
        "raw_transactions": med("raw", "transactions"),
        "db_ms": med("slawatch", "db_ms"),
        "raw_db_ms": med("raw", "db_ms"),
        "writes_per_cycle": med("slawatch", "writes"),
        "connections": max(r["connections"] for r in runs["slawatch"]),
        "raw_connections": max(r["connections"] for r in runs["raw"]),
        "pg_stat_statements": float(statements),
    }
    if statements:
        out["wal_bytes_per_cycle"] = med("slawatch", "wal")
        out["raw_wal_bytes_per_cycle"] = med("raw", "wal")
    out["statements_ratio"] = out["statements"] / out["raw_statements"]
    out["transactions_ratio"] = out["transactions"] / out["raw_transactions"]
    out["db_time_ratio"] = out["db_ms"] / out["raw_db_ms"]
    return out


# ---------------------------------------------------------------- a server that counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def counting_server() -> Iterator[str]:
    """A scratch PostgreSQL 15 cluster with pg_stat_statements loaded (as the system user
    ``postgres`` when run as root: PostgreSQL refuses root); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="slawatch-idle-"))
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        shutil.chown(folder, user, user)
    data, port = folder / "data", _free_port()

    def pg(*args: str) -> None:
        subprocess.run(args, user=user, check=True, capture_output=True, cwd=folder)

    pg(str(PG15 / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres", "--no-sync")
    with (data / "postgresql.conf").open("a") as f:
        f.write(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
            "shared_preload_libraries = 'pg_stat_statements'\n"
            "pg_stat_statements.track_planning = on\nfsync = off\n"
        )
    pg(str(PG15 / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        pg(str(PG15 / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pooler", choices=["auto", "none", "transaction"], default="auto")
    parser.add_argument("--track", choices=["inline", "table"], default="inline")
    parser.add_argument(
        "--warm", type=float, default=WARM, help="seconds each load runs before its window"
    )
    parser.add_argument(
        "--top", type=int, default=0, help="print each slawatch window's N costliest statements"
    )
    args = parser.parse_args()
    global TOP
    TOP = args.top
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # late runs on a busy machine
    given = os.environ.get("SLAWATCH_BENCH_DSN")
    with contextlib.ExitStack() as stack:
        dsn = given or stack.enter_context(counting_server())
        m = measure(dsn, args.rules, args.seconds, args.reps, args.pooler, args.warm, args.track)
    print(
        f"IDLE: {args.rules} rules (track: {args.track}) x every 1s, nothing due; per cycle"
        f" (1 s), medians of {args.reps} interleaved runs of {args.seconds:.0f} s;"
        f" SLAWATCH_POOLER={args.pooler}"
        + ("" if m["pg_stat_statements"] else " (no pg_stat_statements: statements ~ xacts)")
    )
    print(f"{'':24}{'slawatch':>12}{'raw':>12}{'ratio':>8}")
    for label, mine, raw in [
        ("statements", "statements", "raw_statements"),
        ("transactions", "transactions", "raw_transactions"),
        ("DB time, ms", "db_ms", "raw_db_ms"),
        ("WAL bytes", "wal_bytes_per_cycle", "raw_wal_bytes_per_cycle"),
        ("connections", "connections", "raw_connections"),
    ]:
        if mine in m:
            ratio = m[mine] / m[raw] if m[raw] else float("nan")
            print(f"{label:24}{m[mine]:>12,.1f}{m[raw]:>12,.1f}{ratio:>7.2f}x")
    print(f"{'rows written':24}{m['writes_per_cycle']:>12,.1f}")


if __name__ == "__main__":
    sys.exit(main())
