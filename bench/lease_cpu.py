"""What one lease of a row send costs: server and Python CPU per 100 alerts.

The outbox in rows (docs/explanation/outbox-rows.md) is filled as bench/delivery.py
fills it (``--alerts`` claimed with SLAWATCH_OUTBOX=rows), then one connection leases
every send in turn, each lease settling the one before, as a worker does when its
receiver accepts at once (no POSTs). Per 100 alerts: the server process's CPU (from
/proc: the server must run on this machine) and this process's (the statement, the
fetch and the decoding of the answer, as the dispatcher reads it: binary, row_data
through RowDataLoader).

Each VARIANT is a file of SQL run on a copy of the filled database before its leases,
e.g. a ``CREATE OR REPLACE FUNCTION slawatch.lease_row_send`` of another body; the
rounds interleave this tree's lease with each variant's.

    SLAWATCH_BENCH_DSN=... .venv/bin/python bench/lease_cpu.py [--alerts 50000]
        [--rounds 3] [VARIANT.sql ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from benchdb import Scratch
from delivery import backend_cpu, fill_outbox

from slawatch.delivery.dispatcher import LEASE, RowDataBinaryLoader


def leases(dsn: str, setup: str | None, alerts: int) -> tuple[int, float, float]:
    """Lease every send of ``dsn``'s outbox in turn: how many, and the server's and this
    process's CPU ms per 100 alerts."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if setup:
            conn.execute(setup.encode())
        server = backend_cpu(conn)
        cur = conn.cursor(binary=True)
        cur.adapters.register_loader("json", RowDataBinaryLoader)
        now, sent, count = datetime.now(UTC), None, 0
        server0, python0 = server(), time.process_time()
        while True:
            owner = uuid.uuid4()
            params = {
                "now": now,
                "owner": owner,
                "lease": timedelta(seconds=22),
                "notifier": "hook",
                "sent_row": sent[0] if sent else None,
                "sent_owner": sent[1] if sent else None,
                "sent_done": sent[2] if sent else None,
                "sent_skipped": None,
            }
            row = cur.execute(LEASE, params).fetchall()[0]
            if row[0] is None:
                break
            count, sent = count + 1, (row[0], owner, row[4])
        python = time.process_time() - python0
        used = server() - server0
    return count, used * 1e5 / alerts, python * 1e5 / alerts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=50_000, help="alerts in the outbox")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are shown")
    parser.add_argument("variants", nargs="*", type=Path, help="SQL files run before leasing")
    args = parser.parse_args()
    variants: dict[str, str | None] = {"this tree": None}
    variants |= {path.name: path.read_text() for path in args.variants}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    with Scratch() as scratch:
        with psycopg.connect(scratch.create("filled"), autocommit=True) as conn:
            fill_outbox(conn, args.alerts, outbox="rows")
        for r in range(args.rounds):
            for k, (name, setup) in enumerate(variants.items()):
                copy = f"r{r}v{k}"
                try:
                    n, server, python = leases(scratch.create(copy, "filled"), setup, args.alerts)
                finally:
                    scratch.drop(copy)
                got[name].append((server, python))
                print(f"  {name}: {n} leases, server {server:.3f}, Python {python:.3f} ms/100")
    for name, runs in got.items():
        print(
            f"{name}: per 100 alerts server {statistics.median(s for s, _ in runs):.3f} ms,"
            f" Python {statistics.median(p for _, p in runs):.3f} ms (medians of {args.rounds})"
        )


if __name__ == "__main__":
    main()
