"""``slawatch.event()`` as an application calls it: its own role, its own transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from slawatch.config.rules import Rule
from slawatch.engine.migrate import migrate
from slawatch.engine.timers import SIGNATURE
from tests.integration.helpers import Conn

RULE = Rule.model_validate(
    {
        "name": "parcel_undelivered",
        "events": {"start": "parcel_shipped", "stop": ["parcel_delivered"], "within": "72h"},
        "notify": ["ops"],
    }
)
TIMERS = "slawatch.parcel_undelivered_timers"


@pytest.fixture
def app(conn: Conn, dsn: str) -> Iterator[Conn]:
    """A connection as a role that may only use the schema and call slawatch.event()."""
    migrate(conn, [RULE])
    role = f"slawatch_app_{uuid.uuid4().hex[:6]}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        conn.execute(f"GRANT USAGE ON SCHEMA slawatch TO {role}")
        conn.execute(f"GRANT EXECUTE ON FUNCTION slawatch.event({SIGNATURE}) TO {role}")
        params = conninfo_to_dict(dsn) | {"user": role}
        params.pop("password", None)
        with psycopg.connect(make_conninfo(**params)) as c:
            yield c
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_a_start_exists_exactly_when_the_applications_transaction_commits(
    conn: Conn, app: Conn
) -> None:
    at = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    call = "SELECT slawatch.event('parcel_shipped', %s, %s, '{\"carrier\": \"ups\"}', %s)"
    with app.transaction(force_rollback=True):
        assert app.execute(call, ("1Z1", at, "evt-1")).fetchone() == ("accepted",)
    assert conn.execute(f"SELECT count(*) FROM {TIMERS}").fetchone() == (0,)
    with app.transaction():
        assert app.execute(call, ("1Z1", at, "evt-1")).fetchone() == ("accepted",)
        # Named arguments, the rest left to their defaults (at: the transaction's time).
        named = "SELECT slawatch.event(type => 'parcel_shipped', key => '1Z2')"
        assert app.execute(named).fetchone() == ("accepted",)
    rows = conn.execute(
        f"SELECT key, due_at, open, data FROM {TIMERS} WHERE key = '1Z1'"
    ).fetchall()
    assert rows == [("1Z1", at + timedelta(hours=72), True, {"carrier": "ups"})]
    with app.transaction():
        assert app.execute(call, ("1Z3", at, "evt-1")).fetchone() == ("duplicate",)
    assert conn.execute(f"SELECT count(*) FROM {TIMERS}").fetchone() == (2,)


def test_the_application_role_reaches_the_timers_only_through_the_function(app: Conn) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute(f"INSERT INTO {TIMERS} (key) VALUES ('1Z9')")
    app.rollback()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute("SELECT slawatch.event_at(now(), 'parcel_shipped', '1Z9', NULL, NULL, NULL)")


def test_event_is_not_an_sql_function(conn: Conn) -> None:
    # An SQL function with SECURITY DEFINER and SET is never inlined, and PostgreSQL
    # 15-17 plan its body again in every statement that calls it: a third of the cost
    # of a call from the application (bench/events.py). PL/pgSQL plans it once a session.
    migrate(conn, [RULE])
    row = conn.execute(
        "SELECT l.lanname, p.prosecdef FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " WHERE p.oid = %s::regprocedure",
        (f"slawatch.event({SIGNATURE})",),
    ).fetchone()
    assert row == ("plpgsql", True)
