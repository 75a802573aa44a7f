"""What the benchmark scripts share: summary statistics and the machine's description."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(int(len(xs) * p), len(xs) - 1)] if xs else float("nan")


def machine(server_conn: psycopg.Connection[Any]) -> str:
    mem = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) // 1024 // 1024
    row = server_conn.execute(
        "SELECT current_setting('server_version'), current_setting('shared_buffers'),"
        " current_setting('max_wal_size'), current_setting('synchronous_commit')"
    ).fetchone()
    assert row
    load = os.getloadavg()[0]
    return (
        f"machine: {os.cpu_count()} CPUs, {mem} GB memory, load average {load:.1f} at start,"
        f" Python {sys.version.split()[0]};"
        f" PostgreSQL {row[0]} (shared_buffers {row[1]}, max_wal_size {row[2]},"
        f" synchronous_commit {row[3]})"
    )
