"""migrate and check against a real database: DDL, idempotence, rebuilds, bad rules."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from slawatch.errors import ConfigError
from slawatch.migrate import migrate, render
from slawatch.rules import Rule
from tests.integration.helpers import Conn, shop

TABLE = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, ref text, status text NOT NULL, paid_at timestamptz,
    paid_on date, note text, code text UNIQUE
)"""


def rule(**fields: Any) -> Rule:
    base = {
        "name": "late",
        "table": "public.orders",
        "key": "id",
        "deadline": "paid_at",
        "after": "1h",
        "open_when": "status = 'paid'",
        "notify": ["console"],
    }
    return Rule.model_validate(base | fields)


def indexes(conn: Conn) -> dict[str, str]:
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'orders'"
        " AND indexname LIKE 'sw_%'"
    ).fetchall()
    return dict(rows)


def columns(conn: Conn) -> set[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders'"
    ).fetchall()
    return {r[0] for r in rows}


def test_migrate_adds_columns_and_partial_indexes(conn: Conn) -> None:
    conn.execute(TABLE)
    done = migrate(conn, [rule()])
    assert any("added sw_late_n, sw_late_next" in d for d in done)
    assert {"sw_late_n", "sw_late_next"} <= columns(conn)
    idx = indexes(conn)
    assert "(paid_at) WHERE ((sw_late_n = 0) AND (status = 'paid'::text))" in idx["sw_late_first"]
    assert "(sw_late_next) WHERE ((sw_late_next IS NOT NULL) AND" in idx["sw_late_again"]
    tables = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'slawatch'"
    ).fetchall()
    assert {t[0] for t in tables} == {"alert", "delivery"}


def test_migrate_is_idempotent(conn: Conn) -> None:
    conn.execute(TABLE)
    migrate(conn, [rule()])
    before = indexes(conn)
    assert migrate(conn, [rule()]) == []
    assert indexes(conn) == before


def test_changed_condition_rebuilds_the_indexes(conn: Conn) -> None:
    conn.execute(TABLE)
    migrate(conn, [rule()])
    done = migrate(conn, [rule(open_when="status IN ('paid', 'packed')")])
    assert any("dropped index sw_late_first (definition changed)" in d for d in done)
    assert "'packed'" in indexes(conn)["sw_late_first"]
    assert "'packed'" in indexes(conn)["sw_late_again"]


def test_invalid_index_left_by_an_interrupted_build_is_rebuilt(conn: Conn) -> None:
    conn.execute(TABLE)
    migrate(conn, [rule()])
    conn.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'sw_late_first'::regclass"
    )
    done = migrate(conn, [rule()])
    assert done == [
        "public.orders: dropped index sw_late_first (was left invalid)",
        "public.orders: built index sw_late_first",
    ]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"table": "public.nope"}, "table: public.nope does not exist"),
        ({"key": "idd"}, "key: column 'idd' not in public.orders (id, ref, status"),
        ({"key": "ref"}, "key: column 'ref' of public.orders has no unique index"),
        ({"key": "code"}, "key: column 'code' of public.orders may be NULL"),
        ({"deadline": "paid_on"}, "deadline: column 'paid_on' is date; it must be timestamp"),
        ({"deadline": "nope"}, "deadline: column 'nope' not in public.orders"),
        ({"columns": ["id", "total"]}, "columns: column 'total' not in public.orders"),
        ({"open_when": "statuz = 'paid'"}, 'open_when: column "statuz" does not exist'),
        ({"open_when": "paid_at < now()"}, "open_when: functions in index predicate must be"),
        ({"open_when": "id IN (SELECT 1)"}, "open_when: cannot use subquery in index predicate"),
        ({"open_when": "status"}, "open_when: argument of WHERE must be type boolean"),
        ({"open_when": "true) OR (false"}, None),  # odd but one valid expression: accepted
    ],
)
def test_bad_rules_change_nothing(conn: Conn, fields: dict[str, Any], expected: str | None) -> None:
    conn.execute(TABLE)
    bad = rule(**fields)
    bad._source = "rules/late.yaml"  # type: ignore[assignment]
    if expected is None:
        migrate(conn, [bad])
        return
    with pytest.raises(ConfigError) as exc:
        migrate(conn, [rule(name="good"), bad])
    assert str(exc.value).startswith("rules/late.yaml: ")
    assert expected in str(exc.value)
    # Nothing changed: no schema, no columns, no indexes, even for the good rule.
    assert conn.execute("SELECT to_regnamespace('slawatch')").fetchone() == (None,)
    assert not {c for c in columns(conn) if c.startswith("sw_")}
    assert indexes(conn) == {}


def test_printed_migration_runs_as_is(conn: Conn) -> None:
    """What --print shows is what a DBA can run, and it is equivalent to migrate."""
    conn.execute(TABLE)
    script = render([rule()])
    assert 'GRANT UPDATE ("sw_late_n", "sw_late_next") ON "public"."orders"' in script
    conn.execute("CREATE ROLE slawatch_app")
    try:
        for statement in script.split(";\n"):  # CONCURRENTLY: one statement at a time
            code = "\n".join(ln for ln in statement.splitlines() if not ln.startswith("--"))
            if code.strip():
                conn.execute(code)
        assert {"sw_late_first", "sw_late_again"} <= set(indexes(conn))
        assert migrate(conn, [rule()]) == []  # same fingerprints: nothing to do
    finally:
        conn.execute("DROP OWNED BY slawatch_app")
        conn.execute("DROP ROLE slawatch_app")


def test_shop_migrates(conn: Conn) -> None:
    rules = shop(conn)
    assert len(rules) == 4


def test_percent_sign_in_condition_is_literal(conn: Conn) -> None:
    """open_when is SQL text: a LIKE pattern's % must not be taken for a parameter."""
    from datetime import UTC, datetime, timedelta

    from slawatch.claim import plan_claim
    from tests.integration.helpers import claim_all

    conn.execute(TABLE)
    like = rule(open_when="status LIKE 'pai%'")
    migrate(conn, [like])
    now = datetime(2026, 3, 1, tzinfo=UTC)
    conn.execute(
        "INSERT INTO orders (id, status, paid_at) VALUES (1, 'paid', %s), (2, 'shipped', %s)",
        (now - timedelta(hours=2), now - timedelta(hours=2)),
    )
    assert claim_all(conn, plan_claim(like, "timestamp with time zone"), now) == 1


def test_the_printed_grants_are_enough_and_no_more(conn: Conn, dsn: str) -> None:
    """Least privilege: a role with only the printed GRANTs claims and delivers, and
    cannot change the application's own columns."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from slawatch.claim import claim_batch, prepare
    from slawatch.migrate import grants

    conn.execute(TABLE)
    late = rule()
    migrate(conn, [late])
    conn.execute(
        "INSERT INTO orders (id, status, paid_at) VALUES (1, 'paid', now() - interval '1 day')"
    )
    role = f"slawatch_app_{uuid.uuid4().hex[:6]}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        for g in grants([late], role):
            conn.execute(g)
        params = conninfo_to_dict(dsn) | {"user": role}
        params.pop("password", None)
        with psycopg.connect(make_conninfo(**params), autocommit=True) as app:
            plan = prepare(app, late)
            assert claim_batch(app, plan, datetime.now(UTC)) == 1
            app.execute("UPDATE slawatch.delivery SET status = 'sent' WHERE status = 'pending'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("UPDATE orders SET status = 'shipped'")
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_a_rule_changed_since_migrate_is_refused_until_migrated(conn: Conn) -> None:
    from slawatch.claim import prepare

    conn.execute(TABLE)
    migrate(conn, [rule()])
    prepare(conn, rule())
    changed = rule(open_when="status IN ('paid', 'packed')")
    with pytest.raises(
        ConfigError, match=r"changed since the last migrate .* run 'slawatch migrate'"
    ):
        prepare(conn, changed)
    migrate(conn, [changed])
    prepare(conn, changed)
