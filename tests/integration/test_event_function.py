"""``slawatch.event()``'s shape as applications call it: named arguments, defaults, and
a body planned once per session (its rights and transaction: test_events.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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


def test_named_arguments_and_defaults(conn: Conn) -> None:
    migrate(conn, [RULE])
    at = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    call = (
        "SELECT slawatch.event(type => 'parcel_shipped', key => %s, at => %s,"
        ' data => \'{"carrier": "ups"}\', id => %s)'
    )
    assert conn.execute(call, ("1Z1", at, "evt-1")).fetchone() == ("accepted",)
    # The rest left to their defaults: at is the transaction's time, no data, no id.
    assert conn.execute(
        "SELECT slawatch.event(type => 'parcel_shipped', key => '1Z2')"
    ).fetchone() == ("accepted",)
    assert conn.execute(call, ("1Z3", at, "evt-1")).fetchone() == ("duplicate",)
    rows = conn.execute(f"SELECT key, due_at, data FROM {TIMERS} ORDER BY key").fetchall()
    assert rows[0] == ("1Z1", at + timedelta(hours=72), {"carrier": "ups"})
    assert [r[0] for r in rows] == ["1Z1", "1Z2"] and rows[1][2] == {}


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
