"""The long fault run: SIGKILLs of `slawatch run` processes at random points while
rows fall due, complete and get new deadlines, with the database stopped and the
receiver down now and then; then one clean run settles and every alert is
checked against what the run did (each due (row, episode, n) alerted exactly
once, each delivered at least once).

The harness is tests/faultharness.py, the one the CI fault suite
(tests/integration/test_faults.py) runs for ~30 kills; this runs it for as
many as asked. Two processes run at a time; each is killed 0.1-1.5 s after it
connected and restarted at once. Every --outage-every seconds the storm pauses
for a fault with the processes left running: alternately the database is
stopped for --db-down seconds (longer than SLAWATCH_DB_TIMEOUT=2) or restarted
at once; the receiver's outages (503, then its port closed) fall during the
storm, kills and all.

The storm ends at --seconds, with the kills asked for or not: the deadlines are spread
over that long, so faults after it would meet no work. A slower machine than
KILLS_PER_SECOND plans for kills fewer; the run says how many. A receiver outage that
no delivery attempt meets (nothing due then) is reported as such and ends, the receiver
accepting again. The rule has `resolve: true` (--no-resolve: without): each episode
that ended gets one resolved notice, through the same faults, and the check counts
them (one per ended episode, none for an open one, each after its notifications).

    .venv/bin/python bench/faults.py [--kills 1000] [--seconds S] [--rows N] [--seed N]
                                     [--outbox alerts|rows] [--no-resolve]

--outbox sets SLAWATCH_OUTBOX of every process (default: the default shape, rows;
docs/explanation/outbox-rows.md); the check reads what was written in either shape.

The database is a private PostgreSQL server (tests/pgcluster.py) in a
temporary folder, since the run stops it; --no-db-outages uses a scratch
database on SLAWATCH_BENCH_DSN / SLAWATCH_DSN / the embedded server instead.
Exits 1 when the check finds a duplicate, a missing or an undelivered alert.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

# The harness lives with the tests (it is their real-peer support code, like the
# receivers); this script runs from bench/, so the repository root goes on the path.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchdb import scratch_database  # noqa: E402

from slawatch.config.settings import DEFAULT_OUTBOX  # noqa: E402
from tests.faultharness import FaultRun, Report  # noqa: E402

KILLS_PER_SECOND = 0.6  # 2 processes, 2 cores: startup ~1.5 s + 0.8 s alive, and the outages


class Server(Protocol):
    """A PostgreSQL server the run may stop and start."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


@contextmanager
def database(outages: bool) -> Iterator[tuple[str, Server | None]]:
    """The DSN to use and, when the database is to be stopped, its server."""
    if not outages:
        with scratch_database() as dsn:
            yield dsn, None
        return
    from tests.pgcluster import PgCluster

    with PgCluster() as cluster:
        yield cluster.database("faults"), cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="SIGKILLs at least (1000)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="deadlines spread over this long; the storm lasts at least this long "
        f"(default: kills / {KILLS_PER_SECOND})",
    )
    parser.add_argument("--rows", type=int, default=None, help="rows (default 30 per second)")
    parser.add_argument("--processes", type=int, default=2, help="slawatch runs at a time (2)")
    parser.add_argument("--outage-every", type=float, default=60, help="seconds between faults")
    parser.add_argument("--db-down", type=float, default=8, help="seconds the database is down")
    parser.add_argument("--no-db-outages", action="store_true", help="never stop the database")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--no-resolve", action="store_true", help="the rule without resolve: no resolved notices"
    )
    parser.add_argument(
        "--outbox",
        choices=["alerts", "rows"],
        default=DEFAULT_OUTBOX,
        help=f"SLAWATCH_OUTBOX of the processes ({DEFAULT_OUTBOX}, the default shape)",
    )
    args = parser.parse_args()
    seconds = args.seconds or args.kills / KILLS_PER_SECOND
    rows = args.rows or int(30 * seconds)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"seed {seed}, SLAWATCH_OUTBOX={args.outbox}", flush=True)

    with tempfile.TemporaryDirectory(prefix="slawatch-faults-") as tmp:
        folder = Path(tmp)
        with database(not args.no_db_outages) as (dsn, cluster):
            run = FaultRun(
                dsn,
                folder / "run",
                rows=rows,
                spread=seconds,
                seed=seed,
                say=print_flush,
                outbox=args.outbox,
                resolve=not args.no_resolve,
            )
            try:
                report, outages = storm(run, cluster, args, seconds)
            finally:
                run.close()
    print_table(report, outages)
    for line in report.problems:
        print("  " + line)
    return 0 if report.ok else 1


def storm(
    run: FaultRun, cluster: Server | None, args: argparse.Namespace, seconds: float
) -> tuple[Report, dict[str, int]]:
    run.setup()
    started = time.monotonic()
    outages = {
        "database stopped": 0,
        "database restarted": 0,
        "receiver down": 0,
        "  that met no delivery": 0,
    }
    chunk = 0
    # Bounded by --seconds, kills or not: the deadlines are spread over that long.
    while (left := seconds - (time.monotonic() - started)) >= 1:
        length = min(args.outage_every, left)
        receiver: threading.Thread | None = None
        if chunk % 2 == 0:
            # Down during the storm: retries, kills and lease rescues all at once.
            receiver = threading.Thread(
                target=receiver_outage, args=(run, outages, length), daemon=True
            )
            receiver.start()
            outages["receiver down"] += 1
        run.kill_storm(kills=0, seconds=length, processes=args.processes)
        if receiver is not None:
            receiver.join()
        if cluster is not None and time.monotonic() - started < seconds:
            # Only processes past startup: one that cannot start exits 1, as it should.
            run.wait_serving(60)
            long = chunk % 2 == 0
            with run.database_down():
                cluster.stop()
                if long:
                    time.sleep(args.db_down)
                cluster.start()
            outages["database stopped" if long else "database restarted"] += 1
            run.say("database " + (f"back after {args.db_down:g}s" if long else "restarted"))
        chunk += 1
    took = time.monotonic() - started
    short = f"; {args.kills - run.kills:,} short of --kills {args.kills:,}, " + (
        f"bounded by --seconds {seconds:g} (the machine kills slower than {KILLS_PER_SECOND}/s)"
    )
    run.say(
        f"storm over: {run.kills:,} kills, {chunk} chunks, "
        + ", ".join(f"{n} {what.strip()}" for what, n in outages.items())
        + f" in {took:.0f}s"
        + (short if run.kills < args.kills else "")
    )
    run.settle(timeout=600)
    return run.verify(), outages


def receiver_outage(run: FaultRun, outages: dict[str, int], within: float) -> None:
    """The receiver down (5 s of 503, then 5 s closed); an outage that met no delivery
    attempt within the chunk (nothing due) is counted and said, not a dead thread."""
    try:
        run.receiver_outage(5, 5, wait=max(within - 5, 5))
    except TimeoutError:
        outages["  that met no delivery"] += 1
        run.say("receiver outage: the outage met no delivery (nothing was sent while it refused)")


def print_flush(text: str) -> None:
    print(text, flush=True)


def print_table(report: Report, outages: dict[str, int]) -> None:
    lo, hi = report.expected
    figures = [
        ("kills (SIGKILL)", f"{report.kills:,}"),
        *((what, f"{n:,}") for what, n in outages.items()),
        ("rows", f"{report.rows:,}"),
        ("alerts", f"{report.alerts:,}"),
        *((f"  written as {shape}", f"{n:,}") for shape, n in sorted(report.shapes.items())),
        ("alerts the run allows", f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,}"),
        ("resolved notices", f"{report.resolved:,}"),
        ("resolved notices the run requires", f"{report.resolved_expected:,}"),
        ("resolved before a notification", f"{report.misordered:,}"),
        ("duplicates", f"{report.duplicates:,}"),
        ("missing", f"{report.missing:,}"),
        ("unexpected", f"{report.unexpected:,}"),
        ("premature re-notifications", f"{report.premature:,}"),
        ("undelivered", f"{report.undelivered:,}"),
        ("dead deliveries", f"{report.dead:,}"),
        ("redeliveries (same id again)", f"{report.redeliveries:,}"),
        ("processes that exited by themselves", f"{report.exits:,}"),
        ("wall time", f"{report.wall / 60:.1f} min"),
    ]
    width = max(len(name) for name, _ in figures)
    print(f"\n{'figure':<{width}}  value")
    for name, value in figures:
        print(f"{name:<{width}}  {value:>12}")
    print("verdict: " + ("ok" if report.ok else "FAILED"))


if __name__ == "__main__":
    sys.exit(main())
