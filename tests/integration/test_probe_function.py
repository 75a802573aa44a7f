"""Each rule's probe as a function, ``slawatch."<rule>_probe"`` (engine/probefn.py):
created by migrate, replaced when the probe changes, kept when the folder lacks the rule; the
runtime calls it, and runs the probe's text when the function answers for another
definition or is not there."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slawatch.config.rules import Rule
from slawatch.db import Database
from slawatch.engine.claim import anything_due
from slawatch.engine.migrate import migrate, plan, render
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn
from tests.integration.test_outage import late_rule

NOW = datetime.now(UTC)


def functions(conn: Conn) -> dict[str, str]:
    """slawatch's probe functions: name -> body."""
    rows = conn.execute(
        "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = 'slawatch'::regnamespace"
        " AND proname LIKE '%\\_probe'"
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def rule(track: str, open_when: str = "status = 'paid'", name: str = "late") -> Rule:
    return late_rule().model_copy(update={"track": track, "open_when": open_when, "name": name})


def orders(conn: Conn) -> None:
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz)")


def test_migrate_creates_replaces_and_drops_the_probe_function(conn: Conn, track: str) -> None:
    orders(conn)
    done = migrate(conn, [rule(track)])
    assert "slawatch.late_probe: created (rule late's probe)" in done
    first = functions(conn)
    assert list(first) == ["late_probe"]
    assert "status = 'paid'" in first["late_probe"]
    assert plan(conn, [rule(track)]) == []  # up to date: nothing to do again

    done = migrate(conn, [rule(track, "status = 'paid' AND id > 0")])
    assert "slawatch.late_probe: replaced (rule late's probe)" in done
    assert "id > 0" in functions(conn)["late_probe"]

    # A switch of track changes the signature: one function remains, the new one.
    other = "table" if track == "inline" else "inline"
    migrate(conn, [rule(other)])
    args = conn.execute(
        "SELECT pg_get_function_identity_arguments('slawatch.late_probe'::regproc)"
    ).fetchone()
    want = "text, anyelement, anyelement, timestamp with time zone"
    if other == "inline":
        want = "text, anyelement, timestamp with time zone"
    assert args == (want,)

    # A rule the folder lacks keeps its function (a partial folder removes nothing).
    migrate(conn, [rule(other, name="other")])
    assert sorted(functions(conn)) == ["late_probe", "other_probe"]


def test_migrate_print_shows_the_probe_functions(conn: Conn) -> None:
    orders(conn)
    script = render([rule("inline")], plan(conn, [rule("inline")]))
    assert (
        'CREATE OR REPLACE FUNCTION "slawatch"."late_probe"'
        "(text, anyelement, timestamp with time zone)" in script
    )
    # An inline rule's function needs no setting (its statement takes no parameter).
    function = script[script.index('"slawatch"."late_probe"(text') :]
    function = function[: function.index("$sw_probe$")]
    assert "plan_cache_mode" not in function
    offline = render([rule("inline")])
    assert 'CREATE OR REPLACE FUNCTION "slawatch"."late_probe"' in offline


def calls(conn: Conn) -> int:
    row = conn.execute(
        "SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions"
        " WHERE schemaname = 'slawatch' AND funcname = 'late_probe'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_probe_calls_the_function_of_its_own_definition_only(conn: Conn, dsn: str) -> None:
    """An instance asks its rule's function; once migrate has replaced it with another
    definition's (a rolling reload, this instance not reloaded yet), the function
    answers NULL to it and the instance runs its own probe, which sees its own rows."""
    orders(conn)
    migrate(conn, [rule("inline")])
    conn.execute("INSERT INTO orders VALUES (1, 'paid', now() - interval '1 day')")
    values = {"cutoff": NOW, "renotify_by": NOW}
    with (
        Database(dsn, size=1, timeout=10, pooler="transaction") as db,
        db.connection("test") as c,
    ):
        c.execute("SET track_functions = 'pl'")
        claim = prepare(c, rule("inline"))
        assert claim.probe_fn is not None
        assert anything_due(c, claim, NOW)
        assert claim.probe_fn.ask(c, values) is True
        # The next definition, for which row 1 is not open: its function says so...
        migrate(conn, [rule("inline", "status = 'paid' AND id > 100")])
        newer = prepare(c, rule("inline", "status = 'paid' AND id > 100"))
        assert newer.probe_fn is not None
        assert newer.probe_fn.ask(c, values) is False
        # ...and does not answer for the one this instance still runs, which is then
        # not called again for a while: the probe's text alone (engine/probefn.py).
        assert claim.probe_fn.ask(c, values) is None
        assert anything_due(c, claim, NOW)
        c.execute("SELECT pg_stat_force_next_flush()")
        assert calls(c) == 4


def test_without_the_function_the_probe_text_runs(conn: Conn, dsn: str) -> None:
    orders(conn)
    migrate(conn, [rule("inline")])
    with (
        Database(dsn, size=1, timeout=10, pooler="transaction") as db,
        db.connection("test") as c,
    ):
        claim = prepare(c, rule("inline"))
        assert claim.probe_fn is not None
        c.execute('DROP FUNCTION slawatch."late_probe"')  # another folder's migrate
        assert not anything_due(c, claim, NOW)
        assert not claim.probe_fn.usable
        c.execute("INSERT INTO orders VALUES (1, 'paid', now() - interval '1 day')")
        assert anything_due(c, claim, NOW)


def test_the_probe_function_of_each_track_and_its_setting(conn: Conn, dsn: str) -> None:
    """An inline rule's function reads the three values in a statement without
    parameters, which PostgreSQL plans generic at once: no SET on the function (which
    costs a save and restore of the setting at each call); a ``track: table`` rule's
    statement takes the range's bounds, and the SET skips its five custom plans. A
    column named like one of the function's variables is the column."""
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at timestamptz,"
        " sw_due boolean, sw_other boolean)"
    )
    inline = rule("inline", "status = 'paid' AND sw_due IS NOT TRUE AND sw_other IS NOT TRUE")
    migrate(conn, [inline, rule("table", name="other")])
    settings = dict(
        conn.execute(
            "SELECT proname, proconfig FROM pg_proc WHERE pronamespace = 'slawatch'::regnamespace"
            " AND proname LIKE '%\\_probe'"
        ).fetchall()
    )
    assert settings == {
        "late_probe": None,
        "other_probe": ["plan_cache_mode=force_generic_plan"],
    }
    values = {"cutoff": NOW, "renotify_by": NOW}
    with (
        Database(dsn, size=1, timeout=10, pooler="transaction") as db,
        db.connection("test") as c,
    ):
        claim = prepare(c, inline)
        assert claim.probe_fn is not None
        assert claim.probe_fn.ask(c, values) is False
        conn.execute("INSERT INTO orders VALUES (1, 'paid', now() - interval '1 day', true)")
        assert claim.probe_fn.ask(c, values) is False  # not open (sw_due)
        conn.execute("INSERT INTO orders VALUES (2, 'paid', now() - interval '1 day')")
        assert claim.probe_fn.ask(c, values) is True


@pytest.mark.parametrize("kind", ["timestamptz", "timestamp"])
def test_the_probe_text_takes_no_parameter_and_compares_any_deadline(
    conn: Conn, dsn: str, kind: str
) -> None:
    """Straight to the server the scans send the probe's text, prepared; it takes no
    parameter, so PostgreSQL keeps its generic plan from the first run on each
    connection instead of planning it five times more. Its values are compared as the
    statement compared them, whatever the deadline: -infinity and a year BC are due,
    infinity and a year past 9999 are not, and none fails to load."""
    conn.execute(f"CREATE TABLE orders (id bigint PRIMARY KEY, status text, paid_at {kind})")
    migrate(conn, [rule("inline")])
    with Database(dsn, size=1, timeout=10, pooler="none") as db, db.connection("test") as c:
        claim = prepare(c, rule("inline"))
        for _ in range(8):
            assert not anything_due(c, claim, NOW)
        plans = c.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%orders%%paid_at%%'"
        ).fetchall()
        assert plans == [(8, 0)]  # every run on the generic plan, none planned for its values
        expected = {
            "infinity": False,
            "20000-01-01": False,
            "9999-12-31 23:00": False,
            "-infinity": True,
            "0044-03-15 BC": True,
            "0001-01-01": True,
        }
        for paid_at, due in expected.items():
            conn.execute("DELETE FROM orders")
            conn.execute("INSERT INTO orders VALUES (1, 'paid', %s)", (paid_at,))
            assert anything_due(c, claim, NOW) is due, paid_at
        # The re-notification's time too: notified once, again at infinity (never).
        conn.execute("UPDATE orders SET paid_at = now() - interval '2 h'")
        assert anything_due(c, claim, NOW)
        conn.execute("UPDATE orders SET sw_late_seen = paid_at, sw_late_next = 'infinity'")
        assert not anything_due(c, claim, NOW)
        conn.execute("UPDATE orders SET sw_late_next = '-infinity'")
        assert anything_due(c, claim, NOW)
        # Whatever the session's DateStyle (psycopg reads text times in ISO only).
        c.execute("SET DateStyle = 'SQL, DMY'")
        conn.execute("UPDATE orders SET sw_late_next = now() - interval '1 h'")
        assert anything_due(c, claim, NOW)
        conn.execute("UPDATE orders SET sw_late_next = now() + interval '1 h'")
        assert not anything_due(c, claim, NOW)
