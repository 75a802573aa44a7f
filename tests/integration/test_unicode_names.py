"""Names of any script, as PostgreSQL takes them (docs/reference/rules.md): a rule on
``склад.заказы`` keyed by ``ключ`` is checked, migrated (tracking columns, its indexes)
and claimed on both tracks, from the engine and from the command line.

An operator probe found ``key: ключ`` refused as "not letters, digits, _ and $".
"""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slawatch.actions.run import runner
from slawatch.config.rules import Rule
from slawatch.engine.migrate import check, migrate
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn, alerts, alerts_of, claim_all
from tests.integration.test_cli import slawatch

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
# 63 bytes in UTF-8 (PostgreSQL's longest name): 31 two-byte letters and one more.
LONGEST = "я" * 31 + "x"

TABLE = f"""
CREATE SCHEMA склад;
CREATE TABLE склад.заказы (
    ключ bigint PRIMARY KEY,
    статус text NOT NULL,
    оплачен timestamptz NOT NULL,
    "Сумма" integer NOT NULL,
    {LONGEST} text NOT NULL DEFAULT 'долго'
);
INSERT INTO склад.заказы VALUES
    (1, 'оплачен', '2026-03-01 10:00+00', 100),  -- overdue (26 h > 1 h)
    (2, 'отправлен', '2026-03-01 10:00+00', 200),  -- done
    (3, 'оплачен', '2026-03-02 11:30+00', 300);  -- not due yet
"""


def row_data(conn: Conn) -> list[tuple[str, Any]]:
    """(key, row data) of each alert of zakaz_late, whichever shape of the outbox holds
    it (docs/explanation/outbox-rows.md)."""
    return [(key, data) for key, data in alerts_of(conn, "zakaz_late", "key", "row_data")]


# The indexes of склад.заказы after a migrate of rule(track), as pg_indexes defines them:
# its primary key's, and the rule's (docs/explanation/claim.md, tracking.md).
ON = 'ON "склад"."заказы" USING btree'
OPEN = "(\"статус\" = 'оплачен'::text)"
WANTED_INDEXES = {
    "inline": [
        (
            "sw_zakaz_late_again",
            f"INDEX sw_zakaz_late_again {ON} (sw_zakaz_late_next)"
            f' WHERE ((sw_zakaz_late_seen = "оплачен") AND {OPEN})',
        ),
        (
            "sw_zakaz_late_ended",
            f"INDEX sw_zakaz_late_ended {ON} (sw_zakaz_late_seen)"
            " WHERE ((sw_zakaz_late_seen IS NOT NULL) AND ((sw_zakaz_late_seen IS DISTINCT FROM"
            f' "оплачен") OR ({OPEN} IS NOT TRUE)))',
        ),
        (
            "sw_zakaz_late_first",
            f'INDEX sw_zakaz_late_first {ON} ("оплачен")'
            f' WHERE ((sw_zakaz_late_seen IS DISTINCT FROM "оплачен") AND {OPEN})',
        ),
        ("заказы_pkey", f'UNIQUE INDEX "заказы_pkey" {ON} ("ключ")'),
    ],
    "table": [
        ("sw_zakaz_late_deadline", f'INDEX sw_zakaz_late_deadline {ON} ("оплачен")'),
        ("sw_zakaz_late_due", f'INDEX sw_zakaz_late_due {ON} ("оплачен") WHERE {OPEN}'),
        ("заказы_pkey", f'UNIQUE INDEX "заказы_pkey" {ON} ("ключ")'),
    ],
}


def rule(track: str, **fields: Any) -> Rule:
    return Rule.model_validate(
        {
            "name": "zakaz_late",
            "table": "склад.заказы",
            "key": "ключ",
            "deadline": "оплачен",
            "after": "1h",
            "open_when": "статус = 'оплачен'",
            "columns": ["ключ", "Сумма", LONGEST],
            "notify": ["console"],
            "track": track,
        }
        | fields
    )


@pytest.mark.parametrize("track", ["inline", "table"])
def test_a_rule_on_names_of_any_script_is_migrated_and_claimed(conn: Conn, track: str) -> None:
    conn.execute(TABLE)
    watched = rule(track)
    check(conn, [watched])
    migrate(conn, [watched])
    if track == "inline":  # its tracking columns and its partial index on the table
        added = conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'склад.заказы'::regclass"
            " AND attname LIKE '%zakaz_late%' AND NOT attisdropped"
        ).fetchone()
        assert added is not None and added[0] > 0
    # Every index of the table, exactly: each of the rule's on its column, with its
    # predicate ('оплачен' is the status too: an index on any column with open_when in
    # its predicate would have matched "an index that mentions оплачен").
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes"
        " WHERE schemaname = 'склад' AND tablename = 'заказы' ORDER BY 1"
    ).fetchall()
    assert indexes == [(name, f"CREATE {how}") for name, how in WANTED_INDEXES[track]]
    plan = prepare(conn, watched)
    assert claim_all(conn, plan, NOW) == 1
    assert alerts(conn, "zakaz_late") == [("1", 1, "warning", ["console"])]
    assert row_data(conn) == [("1", {"ключ": 1, "Сумма": 100, LONGEST: "долго"})]
    assert claim_all(conn, plan, NOW + timedelta(minutes=1)) == 0  # alerted once


def test_check_migrate_and_run_take_such_a_rule(conn: Conn, dsn: str, tmp_path: Path) -> None:
    conn.execute(TABLE)
    (tmp_path / "zakaz_late.yaml").write_text(
        "table: склад.заказы\nkey: ключ\ndeadline: оплачен\nafter: 1h\n"
        "open_when: \"статус = 'оплачен'\"\ncolumns: [ключ, Сумма]\nnotify: [console]\n",
        encoding="utf-8",
    )
    before = slawatch("--rules", str(tmp_path), "check", dsn=dsn)
    assert before.returncode == 1 and "will add" in before.stdout, before  # needs a migrate
    for command in (["migrate"], ["check"], ["run", "--once"]):
        result = slawatch("--rules", str(tmp_path), *command, dsn=dsn)
        assert result.returncode == 0, result
    rows = row_data(conn)
    # Orders 1 and 3 are overdue by the wall clock (paid in March 2026, one hour allowed).
    assert rows == [("1", {"ключ": 1, "Сумма": 100}), ("3", {"ключ": 3, "Сумма": 300})]


def test_an_actions_placeholder_of_any_script_is_bound(conn: Conn) -> None:
    conn.execute(TABLE)
    acting = rule(
        "inline",
        action={"on": 1, "sql": "UPDATE склад.заказы SET статус = 'просрочен' WHERE ключ = :ключ"},
    )
    migrate(conn, [acting])
    plan = prepare(conn, acting).with_act(runner("on"))
    assert claim_all(conn, plan, NOW) == 1
    statuses = conn.execute("SELECT ключ, статус FROM склад.заказы ORDER BY ключ").fetchall()
    assert statuses == [(1, "просрочен"), (2, "отправлен"), (3, "оплачен")]


def test_a_name_not_in_nfc_is_refused_with_the_name_postgresql_has(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """A name written decomposed (NFD: 'й' as и + U+0306, as some systems write text)
    passed load, then missed the table PostgreSQL has (it compares names byte for byte):
    check and run refuse it in one line naming the composed (NFC) form, which is the
    table's name in the catalog."""
    table, column = "чай", "крайний_срок"  # й: U+0439 (NFC), и + U+0306 (NFD)
    nfd_table, nfd_column = (unicodedata.normalize("NFD", n) for n in (table, column))
    assert (nfd_table, nfd_column) != (table, column)
    conn.execute(  # typed as people type it: NFC
        f"CREATE SCHEMA склад; CREATE TABLE склад.{table} (ключ bigint PRIMARY KEY,"
        f" {column} timestamptz NOT NULL); INSERT INTO склад.{table} VALUES"
        " (1, '2026-03-01 10:00+00')"
    )
    # Why: the decomposed name is another name to PostgreSQL.
    names = conn.execute(
        "SELECT to_regclass(format('склад.%%I', %s::text)) IS NOT NULL,"
        " to_regclass(format('склад.%%I', %s::text)) IS NOT NULL",
        (table, nfd_table),
    ).fetchone()
    assert names == (True, False)
    stored = conn.execute(
        "SELECT c.relname, a.attname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
        " WHERE c.oid = format('склад.%%I', %s::text)::regclass AND a.attnum = 2",
        (table,),
    ).fetchone()
    assert stored == (table, column)

    def write(t: str, d: str) -> None:
        (tmp_path / "chai_late.yaml").write_text(
            f"table: склад.{t}\nkey: ключ\ndeadline: {d}\nafter: 1h\nopen_when: 'true'\n"
            "notify: [console]\n",
            encoding="utf-8",
        )

    write(nfd_table, column)
    for command in (["check"], ["run", "--once"]):
        result = slawatch("--rules", str(tmp_path), *command, dsn=dsn)
        assert result.returncode == 2, result
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"slawatch: error: {tmp_path}/chai_late.yaml: table: "), line
        assert "is not a table name" in line and "(Unicode NFC)" in line, line
        # The name the message says to write is the one the catalog has.
        assert line.endswith(f": '{table}'") and stored[0] == table, line
    write(table, nfd_column)
    result = slawatch("--rules", str(tmp_path), "check", dsn=dsn)
    assert result.returncode == 2 and result.stderr.rstrip().endswith(f": '{column}'"), result
    write(table, column)  # as the messages say: the names PostgreSQL has
    for command in (["migrate"], ["run", "--once"]):
        result = slawatch("--rules", str(tmp_path), *command, dsn=dsn)
        assert result.returncode == 0, result
    assert alerts(conn, "chai_late") == [("1", 1, "warning", ["console"])]
