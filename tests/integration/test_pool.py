"""The pool's check before it hands a connection out (slawatch/db.py): no round trip for
a connection in use a moment ago, one for a connection idle longer than ``check_idle``,
and a connection the server ended while it sat idle is replaced, never handed out.
With ``SLAWATCH_POOLER=auto`` statements are prepared on a connection proven direct
(over TCP or a Unix socket), never on one through a proxy (PgBouncer:
test_pgbouncer.py); a one-shot command's connection follows the setting too."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from slawatch.db import (
    PREPARING,
    Connection,
    Database,
    DatabaseError,
    Pooler,
    PreparedStatementLost,
    attempt,
    connect,
    pipelined,
    quiet,
)
from tests.integration.helpers import Conn
from tests.tcpproxy import TcpProxy
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


def prepared_here(db: Database) -> int:
    """Runs a statement with prepare=True on the pool's connection; how many statements
    the server then holds prepared for that session."""
    with db.connection("preparing") as pooled:
        pooled.execute("SELECT %s::int", (1,), prepare=True)
        row = pooled.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert row is not None
    return int(row[0])


def unix_socket_dsn(dsn: str, conn: Conn) -> str:
    """``dsn``'s database over the server's Unix socket; skip when it has none."""
    row = conn.execute("SELECT current_setting('unix_socket_directories')").fetchone()
    folders = [f.strip() for f in str(row[0] if row else "").split(",") if f.strip()]
    if not folders or folders[0].startswith("@"):
        pytest.skip("the test server has no Unix socket in a folder")
    port = conn.execute("SELECT current_setting('port')").fetchone()
    assert port is not None
    params = conninfo_to_dict(dsn)
    params.update(host=folders[0], port=str(port[0]))
    params.pop("hostaddr", None)
    return make_conninfo("", **params)


@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_auto_prepares_on_a_connection_proven_direct(dsn: str, conn: Conn, over: str) -> None:
    target = dsn if over == "tcp" else unix_socket_dsn(dsn, conn)
    try:
        psycopg.connect(target).close()
    except psycopg.OperationalError as exc:  # pragma: no cover - depends on pg_hba.conf
        pytest.skip(f"no connection over {over}: {exc}")
    with Database(target, size=1, timeout=10, pooler="auto") as db:
        assert prepared_here(db) == 1
        assert db.prepared_statements


def test_auto_prepares_nothing_through_a_proxy(dsn: str) -> None:
    proxy, via = TcpProxy.for_dsn(dsn)
    try:
        with Database(via, size=1, timeout=10, pooler="auto") as db:
            assert prepared_here(db) == 0
            assert not db.prepared_statements
    finally:
        proxy.close()


def test_auto_stops_preparing_when_a_prepared_statement_is_lost(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a pooler that slipped past the check would do: a statement psycopg prepared
    is not there (here: deallocated behind its back). The work runs again, and nothing
    is prepared from then on, on any connection."""
    with Database(dsn, size=1, timeout=10, pooler="auto") as db:
        assert prepared_here(db) == 1
        with db.connection("losing the prepared statements") as pooled:
            pooled.execute("DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$")
        row = db.run("after", lambda c: c.execute("SELECT %s::int", (7,), prepare=True).fetchone())
        assert row == (7,)
        assert not db.prepared_statements
        assert prepared_here(db) == 0
    assert [r.message for r in caplog.records if r.levelno == logging.WARNING] == [
        'prepared statements turned off: prepared statement "_pg3_0" does not exist'
        " (a pooler in transaction mode? set SLAWATCH_POOLER=transaction to start without them)"
    ]


@pytest.mark.parametrize(
    ("pooler", "proxied", "prepares"),
    [
        ("none", True, True),  # told: no pooler (a NAT or a proxy may still be in between)
        ("session", False, True),
        ("auto", False, True),
        ("auto", True, False),
        ("transaction", False, False),
    ],
)
def test_a_one_shot_connection_follows_the_pooler_setting(
    dsn: str, pooler: Pooler, proxied: bool, prepares: bool
) -> None:
    """A one-shot command's connection (connect()) prepares as the pool's would: it used
    to prepare from the 6th run whatever SLAWATCH_POOLER said."""
    proxy, via = TcpProxy.for_dsn(dsn) if proxied else (None, dsn)
    try:
        with connect(via, pooler=pooler) as one_shot:
            one_shot.execute("SELECT %s::int", (1,), prepare=True)
            row = one_shot.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
        assert row == (int(prepares),)
    finally:
        if proxy is not None:
            proxy.close()


def test_an_action_statement_that_meets_a_lost_prepared_statement_did_not_run(
    dsn: str,
) -> None:
    """Under attempt()'s savepoint (an action's statement) a lost prepared statement is
    no refusal of the statement to record: nothing ran, preparing is off in the process,
    and the whole transaction may run again."""
    with connect(dsn, pooler="none") as conn:
        conn.execute("SELECT %(v)s::int", {"v": 1}, prepare=True)
        conn.execute("DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$")
        with pytest.raises(PreparedStatementLost), conn.transaction():
            attempt(conn, "SELECT %(v)s::int", {"v": 2}, max_rows=10)
        assert PREPARING.off
        assert conn.execute("SELECT %(v)s::int", {"v": 3}, prepare=True).fetchone() == (3,)
        row = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert row == (0,)


@pytest.mark.parametrize("pooler", ["none", "auto", "transaction"])
def test_a_dedicated_connection_prepares_nothing(dsn: str, pooler: Pooler) -> None:
    """LISTEN's and readiness's connection: behind a transaction pooler psycopg's default
    (prepared from the 6th run) failed every run after the 5th, or reached another
    session's statement; they run few statements, rarely: never prepared."""
    with (
        Database(dsn, size=1, timeout=10, pooler=pooler) as database,
        database.dedicated("a dedicated connection") as conn,
    ):
        for _ in range(8):
            conn.execute("SELECT %s::int", (1,)).fetchone()
            conn.execute("SELECT 1").fetchone()
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert prepared == (0,)


def test_a_prepared_statement_that_fails_leaves_nothing_prepared_behind(dsn: str) -> None:
    """psycopg forgets a prepared statement whose run failed outside a transaction,
    while the server keeps it (and its plans: about 670 KB for the delivery claim) until
    the connection ends; a statement failing at each scan would grow the server process
    without bound. After a statement fails on a connection that prepares, the pool
    deallocates them all, and psycopg, told so, prepares again what it runs next."""
    with Database(dsn, size=1, timeout=10, pooler="none") as db:
        with db.connection("warm") as c:
            for _ in range(3):
                c.execute("SELECT 1 + %s::int", (1,), prepare=True)
        for i in range(20):
            with pytest.raises(DatabaseError), db.connection("failing") as c:
                c.execute("SELECT %s::int / 0", (i,), prepare=True)
        with db.connection("after") as c:
            assert c.execute("SELECT 1 + %s::int", (2,), prepare=True).fetchone() == (3,)
            left = c.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    assert [s for (s,) in left if "/ 0" in s] == []
    assert len(left) <= 2, left


@pytest.mark.parametrize("autocommit", [True, False])
def test_pipelined_statements_are_one_transaction_and_leave_none_open(
    dsn: str, autocommit: bool
) -> None:
    """``pipelined``: a local setting holds for the statements after it in the block and
    is gone after it, and no transaction is left open, on the pool's autocommit
    connections and on any other."""
    with psycopg.connect(dsn, autocommit=autocommit) as c:
        with pipelined(c):
            c.execute("SELECT set_config('application_name', 'inside', true)")
            cur = c.execute("SELECT current_setting('application_name')")
        assert cur.fetchone() == ("inside",)
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert c.execute("SELECT current_setting('application_name')").fetchone() != ("inside",)
