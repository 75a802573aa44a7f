"""How long the on-call page takes, and how big it is, with many idle rules.

N rules (2,000 by default) on bench/idle.py's tables (each its own table, 1,000 open
rows none due), migrated into database ``--database`` of the server of ``--dsn``
(made, and set up, when it does not exist; kept for the next run: setting up 2,000
rules takes a minute or two). Then ``GET /`` of the admin app (``create_app``, in
process through FastAPI's TestClient, a pool of 2 connections), once to warm the
pool, then ``--reps`` times: the best time, the least CPU time of this process (the
app runs in it: ``time.process_time``, every thread), and the page's size.

    .venv/bin/python bench/page.py [--rules 2000] [--reps 3]
        [--dsn postgresql://postgres@127.0.0.1:5432/postgres] [--database slawatch_page]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psycopg
from fastapi.testclient import TestClient
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
import idle

from slawatch.db import Database
from slawatch.operate.admin import create_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="slawatch_page")
    args = parser.parse_args()
    dsn = psycopg.conninfo.make_conninfo(args.dsn, dbname=args.database)
    with psycopg.connect(args.dsn, autocommit=True) as server:
        exists = server.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (args.database,)
        ).fetchone()
        if exists is None:
            server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.database)))
    if exists is None:
        started = time.monotonic()
        idle.setup(dsn, args.rules, every="5s")
        print(f"set up {args.rules:,} rules in {time.monotonic() - started:.0f} s")
    rules = [idle.rule(i, every="5s") for i in range(args.rules)]
    db = Database(dsn, size=2, timeout=30)
    try:
        app = create_app(db, rules, ["console"], token=None, allow_writes=True)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            assert client.get("/").status_code == 200  # the pool's connections made
            times, cpu = [], []
            for _ in range(args.reps):
                started, used = time.perf_counter(), time.process_time()
                response = client.get("/")
                times.append(time.perf_counter() - started)
                cpu.append(time.process_time() - used)
                assert response.status_code == 200, response.text[:500]
    finally:
        db.close()
    load = os.getloadavg()[0]
    print(
        f"{args.rules:,} rules: GET / {min(times):.2f} s (best of {args.reps}:"
        f" {', '.join(f'{t:.2f}' for t in times)}), CPU {min(cpu):.2f} s,"
        f" {len(response.content):,} bytes;"
        f" load average {load:.1f}"
    )


if __name__ == "__main__":
    main()
