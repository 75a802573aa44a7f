"""Secrets never leave in a DSN: redaction by libpq's own reading of it, connect() errors;
what proves a connection direct (seen_as_sent)."""

from __future__ import annotations

import logging
import socket

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from slawatch.db import (
    PREPARING,
    DatabaseUnavailable,
    PreparedStatementLost,
    connect,
    redact,
    refused,
    seen_as_sent,
    translate,
    unreachable,
)
from slawatch.errors import ConfigError, DatabaseError
from tests.receivers import closed_port

SECRET = "s3cr3t"
TAIL = "t4il9"  # the part of a password after a raw '@', '/' or space


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (
            "postgresql://postgres:s3cr3t@127.0.0.1:5432/shop",
            "postgresql://postgres:***@127.0.0.1:5432/shop",
        ),
        # A raw '@' in the password: libpq ends the password at the first '@' and puts
        # the tail into the host name.
        (
            "postgresql://u:s3cr3t@t4il9@db.example:5432/shop",
            "postgresql://u:***@db.example:5432/shop",
        ),
        # A raw '/': libpq reads host 'u', port 's3cr3t' and database 't4il9@h/shop'.
        ("postgres://u:s3cr3t/t4il9@h/shop", "postgres://u:***@h/shop"),
        ("postgresql://u:s3cr3t%40t4il9@h/shop", "postgresql://u:***@h/shop"),
        (
            "postgresql://h/shop?password=s3cr3t&sslmode=require",
            "postgresql://h/shop?password=***&sslmode=require",
        ),
        ("postgresql://h/shop?sslpassword=s3cr3t", "postgresql://h/shop?sslpassword=***"),
        # A quoted key=value password with a space.
        ("host=h user=u password='s3cr3t t4il9'", "user=u password=*** host=h"),
        ("host=h password=s3cr3t\\ t4il9 dbname=shop", "password=*** dbname=shop host=h"),
        # Nothing secret: shown as written.
        (
            "postgresql://postgres@127.0.0.1:5432/postgres",
            "postgresql://postgres@127.0.0.1:5432/postgres",
        ),
        ("host=/var/run/postgresql dbname=shop", "host=/var/run/postgresql dbname=shop"),
    ],
)
def test_redact_hides_every_password(dsn: str, shown: str) -> None:
    assert redact(dsn) == shown


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:s3cr3t t4il9@h/shop",  # a raw space in a URI
        "postgresql://u:s3cr3t@[::1:5432/shop",  # a malformed URI
        "host=h password=s3cr3t t4il9",  # an unquoted space in key=value
        "host=h passwd=s3cr3t",  # not a libpq option
        "s3cr3t",
    ],
)
def test_a_dsn_libpq_cannot_parse_is_not_shown(dsn: str) -> None:
    shown = redact(dsn)
    assert SECRET not in shown and TAIL not in shown
    assert "cannot be parsed" in shown
    with pytest.raises(ConfigError) as caught:
        connect(dsn)
    # psycopg's own parse error quotes the DSN: it must not come through.
    assert SECRET not in str(caught.value) and TAIL not in str(caught.value)
    assert "cannot be parsed" in str(caught.value)


@pytest.mark.parametrize(
    "template",
    [
        "postgresql://u:s3cr3t@127.0.0.1:{port}/shop",
        "postgresql://u:s3cr3t@t4il9@127.0.0.1:{port}/shop",  # libpq's host: 't4il9@127.0.0.1'
        "postgresql://u:s3cr3t/t4il9@127.0.0.1:{port}/shop",  # libpq's port: 's3cr3t'
        "host=127.0.0.1 port={port} user=u password='s3cr3t t4il9'",
    ],
)
def test_connect_errors_name_the_server_not_the_password(template: str) -> None:
    dsn = template.format(port=closed_port())
    with pytest.raises(DatabaseError) as caught:
        connect(dsn)
    message = str(caught.value)
    assert message.startswith("cannot connect to ")
    assert SECRET not in message and TAIL not in message
    assert "***" in message


def test_unreachable_tells_outages_from_refused_queries() -> None:
    assert unreachable(PoolTimeout("couldn't get a connection after 1.00 sec"))
    assert unreachable(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert unreachable(psycopg.errors.AdminShutdown("terminating connection"))
    assert unreachable(psycopg.errors.CannotConnectNow("the database system is starting up"))
    assert not unreachable(psycopg.errors.UndefinedTable('relation "x" does not exist'))
    assert not unreachable(psycopg.errors.LockNotAvailable("lock timeout"))
    assert not unreachable(ValueError("not a driver error"))


def test_translate_names_the_work_and_keeps_the_kind() -> None:
    timeout = PoolTimeout("couldn't get a connection after 1.00 sec")
    with (
        pytest.raises(DatabaseUnavailable, match=r"^claim for rule r: no connection became"),
        translate("claim for rule r"),
    ):
        raise timeout
    lost = psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist')
    with pytest.raises(PreparedStatementLost), translate("x"):
        raise lost
    # An application's own statement of that name is not psycopg's to re-prepare.
    other = psycopg.errors.InvalidSqlStatementName('prepared statement "mine" does not exist')
    with pytest.raises(DatabaseError) as caught, translate("x"):
        raise other
    assert type(caught.value) is DatabaseError


def test_the_first_sign_of_a_pooler_turns_preparing_off_for_the_process_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Either of psycopg's own names lost or taken is a sign; the application's own
    statement names and other errors are not. One warning however many signs."""
    assert not PREPARING.sign(psycopg.errors.InvalidSqlStatementName('"mine" does not exist'))
    assert not PREPARING.sign(psycopg.errors.InvalidDatetimeFormat('"_pg3_0" of type timestamp'))
    assert not PREPARING.off
    for sign in (
        psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists'),
        psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_4" does not exist'),
    ):
        assert PREPARING.sign(sign)
        assert PREPARING.off
    turned_off = [r for r in caplog.records if "prepared statements turned off" in r.message]
    assert [r.levelno for r in turned_off] == [logging.WARNING]
    assert 'prepared statement "_pg3_0" already exists' in turned_off[0].message


AT = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize(
    ("message", "for_good"),
    [
        # The server answered and will not let us in: waiting cannot change that.
        (AT + 'FATAL:  database "shop" does not exist', True),
        (AT + 'FATAL:  role "slawatch" does not exist', True),
        (AT + 'FATAL:  password authentication failed for user "slawatch"', True),
        (AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "s", database "shop"', True),
        (AT + 'FATAL:  role "slawatch" is not permitted to log in', True),
        (AT + 'FATAL:  permission denied for database "shop"', True),
        (AT + "fe_sendauth: no password supplied", True),
        (AT + "server does not support SSL, but SSL was required", True),
        (AT + "SSL error: certificate verify failed", True),
        (AT + "channel binding required, but server authenticated client without it", True),
        ('connection is bad: invalid sslmode value: "sometimes"', True),
        ('connection is bad: invalid integer value "x" for connection option "port"', True),
        # Not there for us yet: worth waiting for.
        (AT + "Connection refused", False),
        (AT + "FATAL:  the database system is starting up", False),
        (AT + "FATAL:  the database system is shutting down", False),
        (AT + "FATAL:  the database system is not yet accepting connections", False),
        (AT + "FATAL:  sorry, too many clients already", False),
        (AT + "server closed the connection unexpectedly", False),
        ("connection timeout expired", False),
        ("failed to resolve host 'db': [Errno -2] Name or service not known", False),
    ],
)
def test_refused_tells_a_wrong_setting_from_a_server_not_there_yet(
    message: str, for_good: bool
) -> None:
    assert refused(psycopg.OperationalError(message)) is for_good


def test_refused_is_only_about_failed_connections() -> None:
    # A query's error carries its SQLSTATE; only a failed connection has none.
    assert not refused(psycopg.errors.UndefinedTable('relation "x" does not exist'))
    assert not refused(ValueError("permission denied"))


# A session as the server reports it (pg_backend_pid, client address, client port, its
# port), and the client's own view of the same connection.
PID, HERE, PORT = 4242, ("10.0.0.7", 51234), 5432


@pytest.mark.parametrize(
    ("family", "local", "seen", "direct"),
    [
        (socket.AF_INET, HERE, (PID, "10.0.0.7", 51234, PORT), True),
        (socket.AF_INET6, ("::ffff:10.0.0.7", 51234, 0, 0), (PID, "10.0.0.7", 51234, PORT), True),
        (socket.AF_INET6, ("fe80::1%eth0", 51234, 0, 2), (PID, "fe80::1", 51234, PORT), True),
        (socket.AF_UNIX, "", (PID, None, None, PORT), True),
        # a pooler: a key of its own (the server's process is another)
        (socket.AF_INET, HERE, (PID + 1, "10.0.0.7", 51234, PORT), False),
        (socket.AF_UNIX, "", (PID + 1, None, None, PORT), False),
        # a proxy or pooler: the server sees its socket, not ours
        (socket.AF_INET, HERE, (PID, "10.0.0.8", 51234, PORT), False),
        (socket.AF_INET, HERE, (PID, "10.0.0.7", 51235, PORT), False),
        (socket.AF_INET, HERE, (PID, None, None, PORT), False),  # it came over a Unix socket
        (socket.AF_UNIX, "", (PID, "10.0.0.7", 51234, PORT), False),  # ... over TCP
        # over Unix sockets: another port's socket file (a pooler's, 6432) is not the server's
        (socket.AF_UNIX, "", (PID, None, None, 6432), False),
    ],
)
def test_a_connection_is_direct_only_when_the_server_sees_it_as_sent(
    family: int, local: object, seen: tuple[object, ...], direct: bool
) -> None:
    assert seen_as_sent(PID, family, local, PORT, seen) is direct
