"""`slawatch migrate` on a fresh database: the outbox's conversion into id ranges
(0015_rotate.sql, slawatch/engine/rotate.py) in one transaction, against the steps.

On a fresh database the old outbox is empty: ``rotate.convert`` converts it in one
transaction (``slawatch.history_convert_all``). The variant before it went through the
steps a large outbox needs (the days read, the mirror triggers installed, the copy's
progress, the swap): ``rotate.convert(at_once=False)``. Each round makes two empty
databases (not timed) and migrates each the way ``migrate`` does -- slawatch's
migrations, one transaction each, then the conversion, then a ``migrate`` that finds
nothing left -- one variant after the other, the order alternating. It prints the
medians of the whole and of the conversion alone, and their ratios; and the
conversion's round trips to the server (counted once per variant in a libpq trace),
which a server across a network pays each.

    .venv/bin/python bench/migrate_fresh.py             # 7 rounds
    .venv/bin/python bench/migrate_fresh.py --reps 11
    .venv/bin/python bench/migrate_fresh.py --rtt-ms 5  # a server 5 ms away

Uses SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/).
Every database it makes is dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdb import Scratch
from common import machine, med

from slawatch.clock import Clock
from slawatch.engine import rotate, schema
from slawatch.engine.migrate import migrate

VARIANTS = {"at once": True, "steps": False}


class Delay:
    """A TCP proxy to the server that holds each chunk the client sends for ``rtt``
    seconds: a server across a network, as far as round trips go (``--rtt-ms``)."""

    def __init__(self, dsn: str, rtt: float) -> None:
        params = conninfo_to_dict(dsn)
        self.target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self.rtt = rtt
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    def dsn(self, dsn: str) -> str:
        port = self.listener.getsockname()[1]
        return make_conninfo(dsn, host="127.0.0.1", port=str(port), sslmode="disable")

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._pump, args=(client, server, self.rtt), daemon=True
            ).start()
            threading.Thread(target=self._pump, args=(server, client, 0.0), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, wait: float) -> None:
        try:
            while data := src.recv(65536):
                if wait:
                    time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def round_trips(trace: str) -> int:
    """The client's waits for the server in a libpq trace: a simple Query, or a Sync
    that ends an extended-protocol statement, each answered before the next is sent."""
    return sum(1 for line in trace.splitlines() if re.search(r"\tF\t\d+\t(Query|Sync)\b", line))


def one(dsn: str, at_once: bool, trace: bool = False) -> tuple[float, float, int]:
    """Seconds of the whole migrate, and of its conversion, on the empty database ``dsn``;
    with ``trace``, the conversion's round trips (the libpq trace costs time: not timed)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        trips = 0
        with schema.migrate_lock(conn):
            for change in schema.pending(conn):
                schema.apply(conn, change, Clock().now())
            with tempfile.TemporaryFile("w+") as out:
                if trace:
                    conn.pgconn.trace(out.fileno())
                converting = time.perf_counter()
                rotate.convert(conn, at_once=at_once)
                converted = time.perf_counter()
                if trace:
                    conn.pgconn.untrace()
                    out.seek(0)
                    trips = round_trips(out.read())
        assert migrate(conn, []) == []  # nothing left: what migrate would have done
        ended = time.perf_counter()
        assert conn.execute(
            "SELECT relkind FROM pg_class WHERE oid = 'slawatch.alert'::regclass"
        ).fetchone() == ("p",)
    return ended - started, converted - converting, trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="rounds (each variant once)")
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0, help="a round trip's added delay (a TCP proxy)"
    )
    args = parser.parse_args()
    whole: dict[str, list[float]] = {name: [] for name in VARIANTS}
    conversion: dict[str, list[float]] = {name: [] for name in VARIANTS}
    trips: dict[str, int] = {}
    with Scratch() as scratch:
        with psycopg.connect(scratch.server, autocommit=True) as admin:
            print(machine(admin))
        delay = Delay(scratch.server, args.rtt_ms / 1000) if args.rtt_ms else None
        if delay is not None:
            print(f"through a proxy adding {args.rtt_ms:g} ms to each round trip")
        for name, at_once in VARIANTS.items():  # once each, traced, before the timed rounds
            dsn = scratch.create(f"trace_{'once' if at_once else 'steps'}")
            trips[name] = one(dsn, at_once, trace=True)[2]
            scratch.drop(f"trace_{'once' if at_once else 'steps'}")
        print("the conversion's round trips: " + ", ".join(f"{n} {t}" for n, t in trips.items()))
        for rep in range(args.reps):
            order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                dsn = scratch.create(f"r{rep}_{'once' if VARIANTS[name] else 'steps'}")
                if delay is not None:
                    dsn = delay.dsn(dsn)
                total, convert, _ = one(dsn, VARIANTS[name])
                whole[name].append(total)
                conversion[name].append(convert)
                scratch.drop(f"r{rep}_{'once' if VARIANTS[name] else 'steps'}")
            print(
                f"round {rep + 1}: "
                + ", ".join(
                    f"{n} {whole[n][-1] * 1000:.0f} ms (conversion {conversion[n][-1] * 1000:.0f})"
                    for n in VARIANTS
                ),
                flush=True,
            )
    print(f"\nmedians of {args.reps} interleaved rounds, an empty database each:")
    for name in VARIANTS:
        print(
            f"  {name:8} migrate {med(whole[name]) * 1000:7.1f} ms,"
            f" of which the conversion {med(conversion[name]) * 1000:6.1f} ms"
        )
    print(
        f"  steps / at once: migrate {med(whole['steps']) / med(whole['at once']):.2f}x,"
        f" conversion {med(conversion['steps']) / med(conversion['at once']):.2f}x;"
        f" round trips {trips['steps']} / {trips['at once']}"
        f" (at 10 ms a round trip: {(trips['steps'] - trips['at once']) * 10} ms more by steps)"
    )


if __name__ == "__main__":
    main()
