"""A scratch database for a benchmark run, on the configured or the embedded server."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from slawatch.db import embedded_dsn, with_database


@contextmanager
def scratch_database() -> Iterator[str]:
    """A new database (SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else embedded); dropped after."""
    dsn = os.environ.get("SLAWATCH_BENCH_DSN") or os.environ.get("SLAWATCH_DSN")
    server = dsn or embedded_dsn(Path(".slawatch"))
    name = f"slawatch_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            admin.execute(drop)
