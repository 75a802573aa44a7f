"""The pool's check before it hands a connection out (slawatch/db.py): no round trip for
a connection in use a moment ago, one for a connection idle longer than ``check_idle``,
and a connection the server ended while it sat idle is replaced, never handed out."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator

import pytest

from slawatch.db import Connection, Database, quiet
from tests.integration.helpers import Conn
from tests.waiting import wait_until


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=1, timeout=10) as database:
        yield database


def the_connection(db: Database) -> Connection:
    """The pool's one connection (size 1): the one every later checkout gets."""
    with db.connection("taking the pool's connection") as pooled:
        return pooled


def checkout_requests(db: Database, pooled: Connection) -> int:
    """Requests (simple queries, empty ones included; or Syncs) sent on ``pooled`` while
    it is taken out of the pool and given back, from libpq's protocol trace."""
    with tempfile.TemporaryFile("w+") as trace:
        pooled.pgconn.trace(trace.fileno())
        try:
            with db.connection("checking out") as conn:
                assert conn is pooled
        finally:
            pooled.pgconn.untrace()
        trace.seek(0)
        sent = [line.split("\t") for line in trace.read().splitlines()]
    return sum(1 for f in sent if len(f) > 3 and f[1] == "F" and f[3] in ("Query", "Sync"))


def test_a_connection_in_use_a_moment_ago_is_handed_out_without_a_round_trip(
    db: Database,
) -> None:
    pooled = the_connection(db)
    assert checkout_requests(db, pooled) == 0


def test_a_connection_idle_longer_than_check_idle_is_checked_first(db: Database) -> None:
    pooled = the_connection(db)
    db.check_idle = 0.0  # every connection has been idle "too long"
    assert checkout_requests(db, pooled) == 1  # the empty query of psycopg_pool's check


def test_a_connection_the_server_ended_while_idle_is_replaced(
    db: Database, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """What a server restart does to every idle pooled connection, to one of them."""
    caplog.set_level(logging.INFO, logger="slawatch")
    pooled = the_connection(db)
    pid = pooled.info.backend_pid
    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # The server's goodbye (an error, then the socket closed) has reached the client.
    wait_until(lambda: not quiet(pooled), "the ended session's socket to be readable")

    row = db.run(
        "a query after the session ended", lambda c: c.execute("SELECT pg_backend_pid()").fetchone()
    )

    assert row is not None and row[0] != pid
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
