"""Scratch databases for a benchmark run, on the configured or the embedded server."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from slawatch.db import embedded_dsn, with_database


def server_dsn() -> str:
    """SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else the embedded server (.slawatch/)."""
    dsn = os.environ.get("SLAWATCH_BENCH_DSN") or os.environ.get("SLAWATCH_DSN")
    return dsn or embedded_dsn(Path(".slawatch"))


@contextmanager
def scratch_database() -> Iterator[str]:
    """A new database (SLAWATCH_BENCH_DSN, else SLAWATCH_DSN, else embedded); dropped after."""
    with Scratch() as scratch:
        yield scratch.create("db")


class Scratch:
    """Creates databases (optionally cloned from another) and drops every one on exit.

    Clones use ``STRATEGY FILE_COPY``: a file copy after a checkpoint, seconds for a
    gigabyte, where PostgreSQL 15's default (WAL_LOG) would write the whole copy to WAL.
    """

    def __init__(self) -> None:
        self.server = server_dsn()
        self.prefix = f"slawatch_bench_{uuid.uuid4().hex[:8]}_"
        self.names: list[str] = []

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        for name in reversed(self.names):
            self.drop(name)

    def dsn(self, name: str) -> str:
        return with_database(self.server, self.prefix + name)

    def create(self, name: str, template: str | None = None) -> str:
        """Create ``name`` (empty, or a copy of ``template``); return its DSN."""
        full = self.prefix + name
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(full))
        if template is not None:
            stmt = sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(full), sql.Identifier(self.prefix + template)
            )
        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(stmt)
        self.names.append(name)
        return self.dsn(name)

    def drop(self, name: str) -> None:
        full = self.prefix + name
        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(full))
            )
        if name in self.names:
            self.names.remove(name)
