"""Watching never changes the data: ``track: inline`` is refused on a table whose
UPDATEs set something off (triggers, rewrite rules, publications), at ``check``,
``migrate`` (``--baseline``, ``--print``) and ``run``'s start, unless the rule says
``inline_triggers: fire``.

The table is modelled on the public sample database where this was found (pagila's
``rental`` and its ``last_updated`` trigger): 183 claimed rows had their
``last_update`` rewritten by the table's own trigger.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slawatch.config.rules import Rule
from slawatch.engine.migrate import check, migrate
from slawatch.engine.ready import prepare_all
from slawatch.errors import ConfigError
from tests.integration.helpers import Conn, claim_all, plans
from tests.integration.test_cli import assert_one_line_error, slawatch

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)

RENTAL = """
CREATE TABLE rental (
    rental_id   integer PRIMARY KEY,
    rental_date timestamptz NOT NULL,
    return_date timestamptz,
    last_update timestamptz NOT NULL
);
CREATE FUNCTION last_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.last_update = CURRENT_TIMESTAMP;
    RETURN NEW;
END $$;
"""
LAST_UPDATED = (
    "CREATE TRIGGER last_updated BEFORE UPDATE ON rental FOR EACH ROW EXECUTE FUNCTION"
    " last_updated()"
)


def rule(**fields: Any) -> Rule:
    base = {
        "name": "unreturned",
        "table": "public.rental",
        "deadline": "rental_date",
        "after": "7d",
        "open_when": "return_date IS NULL",
        "notify": ["console"],
    }
    return Rule.model_validate(base | fields)


def rental(conn: Conn, rows: int = 183) -> None:
    """``rows`` rentals overdue for years, never returned, last updated long ago."""
    conn.execute(RENTAL)
    conn.execute(
        "INSERT INTO rental SELECT g, %s - g * interval '1 day', NULL, %s"
        " FROM generate_series(1, %s) g",
        (NOW - timedelta(days=30), LONG_AGO, rows),
    )


def last_updates(conn: Conn) -> set[Any]:
    return {r[0] for r in conn.execute("SELECT DISTINCT last_update FROM rental")}


def refusal(conn: Conn, rules: list[Rule]) -> str:
    with pytest.raises(ConfigError) as exc:
        check(conn, rules)
    return str(exc.value)


def test_a_before_update_trigger_refuses_inline_and_nothing_is_written(conn: Conn) -> None:
    rental(conn)
    conn.execute(LAST_UPDATED)
    message = refusal(conn, [rule()])
    assert "\n" not in message
    assert message.startswith("<config>: track: inline: each claim UPDATEs the rows of")
    assert "trigger last_updated (BEFORE UPDATE, each row)" in message
    assert "use track: table" in message and "inline_triggers: fire" in message
    with pytest.raises(ConfigError, match="trigger last_updated"):
        migrate(conn, [rule()])
    columns = conn.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = 'rental'::regclass"
        " AND attname LIKE 'sw\\_%'"
    ).fetchone()
    assert columns == (0,)  # nothing was added, nothing rewritten
    assert last_updates(conn) == {LONG_AGO}


def test_track_table_watches_the_same_rows_and_changes_none(conn: Conn) -> None:
    rental(conn)
    conn.execute(LAST_UPDATED)
    watched = rule(track="table")
    migrate(conn, [watched])
    assert claim_all(conn, plans(conn, {"r": watched})["r"], NOW) == 183
    assert last_updates(conn) == {LONG_AGO}


def test_inline_triggers_fire_accepts_them(conn: Conn) -> None:
    """What the operator accepts: the trigger runs for every claimed row."""
    rental(conn)
    conn.execute(LAST_UPDATED)
    accepted = rule(inline_triggers="fire")
    migrate(conn, [accepted])
    assert claim_all(conn, plans(conn, {"r": accepted})["r"], NOW) == 183
    assert LONG_AGO not in last_updates(conn)


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        (
            "CREATE TRIGGER audit AFTER UPDATE ON rental FOR EACH STATEMENT EXECUTE FUNCTION"
            " last_updated()",
            "trigger audit (AFTER UPDATE, each statement)",
        ),
        (
            "CREATE CONSTRAINT TRIGGER later AFTER UPDATE ON rental DEFERRABLE"
            " FOR EACH ROW EXECUTE FUNCTION last_updated()",
            "constraint trigger later (AFTER UPDATE, each row)",
        ),
        (
            "CREATE TRIGGER touch BEFORE UPDATE ON rental FOR EACH ROW EXECUTE FUNCTION"
            " last_updated(); ALTER TABLE rental ENABLE ALWAYS TRIGGER touch",
            "trigger touch (BEFORE UPDATE, each row)",
        ),
        (
            "CREATE TABLE rental_log (id integer);"
            " CREATE RULE log AS ON UPDATE TO rental DO ALSO INSERT INTO rental_log"
            " VALUES (NEW.rental_id)",
            "rule log (ON UPDATE DO ALSO)",
        ),
        (
            "CREATE PUBLICATION shop FOR TABLE rental",
            "publication shop (logical replication ships each claimed row)",
        ),
        (
            "CREATE PUBLICATION everything FOR ALL TABLES",
            "publication everything (logical replication ships each claimed row)",
        ),
    ],
)
def test_what_an_update_sets_off_is_named(conn: Conn, ddl: str, named: str) -> None:
    rental(conn, rows=1)
    conn.execute(ddl)
    try:
        assert named in refusal(conn, [rule()])
    finally:
        conn.execute("DROP PUBLICATION IF EXISTS shop, everything")


@pytest.mark.parametrize(
    "ddl",
    [
        # The claim sets only slawatch's columns: a trigger on others never fires.
        "CREATE TRIGGER paid BEFORE UPDATE OF return_date ON rental FOR EACH ROW"
        " EXECUTE FUNCTION last_updated()",
        LAST_UPDATED + "; ALTER TABLE rental DISABLE TRIGGER last_updated",
        "CREATE TRIGGER made BEFORE INSERT OR DELETE ON rental FOR EACH ROW"
        " EXECUTE FUNCTION last_updated()",
        # A foreign key's internal triggers check only a changed key.
        "CREATE TABLE store (id integer PRIMARY KEY); ALTER TABLE rental ADD COLUMN store_id"
        " integer REFERENCES store; CREATE TABLE payment (rental_id integer REFERENCES rental)",
        "CREATE PUBLICATION inserts FOR TABLE rental WITH (publish = 'insert, delete')",
        "CREATE TABLE other (id integer); CREATE PUBLICATION shop FOR TABLE other",
    ],
)
def test_what_an_update_of_the_tracking_columns_does_not_set_off_is_allowed(
    conn: Conn, ddl: str
) -> None:
    rental(conn, rows=1)
    conn.execute(ddl)
    try:
        check(conn, [rule()])
    finally:
        conn.execute("DROP PUBLICATION IF EXISTS inserts, shop")


def test_a_partitioned_table_is_refused_for_its_partitions_triggers_too(conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE rental (rental_id integer, rental_date timestamptz NOT NULL,"
        " return_date timestamptz, last_update timestamptz NOT NULL,"
        " PRIMARY KEY (rental_id, rental_date)) PARTITION BY RANGE (rental_date);"
        " CREATE TABLE rental_2025 PARTITION OF rental"
        " FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');"
        " CREATE TABLE rental_2026 PARTITION OF rental"
        " FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');"
        " CREATE FUNCTION last_updated() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN NEW.last_update = now(); RETURN NEW; END $$"
    )
    check(conn, [rule()])
    conn.execute(
        "CREATE TRIGGER stamp BEFORE UPDATE ON rental_2026 FOR EACH ROW"
        " EXECUTE FUNCTION last_updated()"
    )
    assert "trigger stamp on public.rental_2026 (BEFORE UPDATE, each row)" in refusal(
        conn, [rule()]
    )
    conn.execute("DROP TRIGGER stamp ON rental_2026")
    # On the parent: cloned into each partition, named once.
    conn.execute(LAST_UPDATED)
    message = refusal(conn, [rule()])
    assert message.count("last_updated") == 1
    assert "trigger last_updated (BEFORE UPDATE, each row)" in message


def test_a_trigger_created_after_migrate_stops_run_from_starting(conn: Conn) -> None:
    rental(conn)
    migrate(conn, [rule()])
    conn.execute(LAST_UPDATED)
    with pytest.raises(ConfigError, match="would set off trigger last_updated"):
        prepare_all(conn, [rule()])
    assert last_updates(conn) == {LONG_AGO}


def test_every_command_refuses_in_one_line(conn: Conn, dsn: str, tmp_path: Path) -> None:
    rental(conn)
    (tmp_path / "unreturned.yaml").write_text(
        "table: rental\nkey: rental_id\ndeadline: rental_date\nafter: 7d\n"
        "open_when: return_date IS NULL\nnotify: [console]\n"
    )
    assert slawatch("--rules", str(tmp_path), "migrate", dsn=dsn).returncode == 0
    conn.execute(LAST_UPDATED)
    for command in (
        ["check"],
        ["migrate"],
        ["migrate", "--baseline"],
        ["migrate", "--print"],
        ["run", "--once"],
        ["run", "--dry-run"],
    ):
        result = slawatch("--rules", str(tmp_path), *command, dsn=dsn)
        assert_one_line_error(
            result, 2, "unreturned.yaml: track: inline: each claim UPDATEs the rows of rental"
        )
        assert result.stderr.count("\n") == 1, result.stderr
    assert last_updates(conn) == {LONG_AGO}
