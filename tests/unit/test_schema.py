"""The migration files' loader, and the frozen legacy upgrade (no database)."""

from __future__ import annotations

import hashlib

import pytest

from slawatch.engine.queries import legacy_upgrade_sql
from slawatch.engine.schema import Change, every_change, migrations, parse_migrations, printed
from slawatch.errors import SlawatchError

SQL = "CREATE TABLE slawatch.t (id int);\n"


def test_files_are_ordered_by_number() -> None:
    found = parse_migrations({"0002_add_t.sql": SQL, "0001_initial.sql": SQL, "0003_x2.sql": SQL})
    assert [(m.version, m.name, m.filename) for m in found] == [
        (1, "initial", "0001_initial.sql"),
        (2, "add_t", "0002_add_t.sql"),
        (3, "x2", "0003_x2.sql"),
    ]


@pytest.mark.parametrize(
    ("files", "error"),
    [
        (
            {"0001_initial.sql": SQL, "0003_late.sql": SQL},
            "0003_late.sql follows a gap: 0002 is missing",
        ),
        ({"0002_first.sql": SQL}, "0002_first.sql follows a gap: 0001 is missing"),
        (
            {"0001_initial.sql": SQL, "0002_a.sql": SQL, "0002_b.sql": SQL},
            "0002_a.sql and 0002_b.sql have the same number",
        ),
        ({"0001_initial.sql": SQL, "002_short.sql": SQL}, "002_short.sql: not a migration's name"),
        ({"0001_initial.sql": SQL, "0002-dash.sql": SQL}, "0002-dash.sql: not a migration's name"),
        ({"0001_Initial.sql": SQL}, "0001_Initial.sql: not a migration's name"),
        ({"0000_zero.sql": SQL, "0001_initial.sql": SQL}, "0000_zero.sql: numbers start at 0001"),
        ({}, "no migrations"),
        ({"0001_initial.sql": "SELECT '$migration$';"}, "contains $migration$"),
    ],
)
def test_a_bad_set_of_files_is_refused_in_one_line(files: dict[str, str], error: str) -> None:
    with pytest.raises(SlawatchError) as caught:
        parse_migrations(files)  # type: ignore[arg-type]
    assert error in str(caught.value)
    assert str(caught.value).startswith("slawatch/sql/migrations")
    assert "\n" not in str(caught.value)


def test_the_shipped_migrations_load() -> None:
    found = migrations()
    assert found[0].filename == "0001_initial.sql"
    assert [m.version for m in found] == list(range(1, len(found) + 1))


# The previous release's schema.sql: databases from before versioning depend on exactly
# this text (it is their upgrade path). A schema change is a new migration instead.
# (Changed once since, in two comments only: they cited documents no longer there.)
LEGACY_SHA256 = "bd7dc38bd81b59cc4d1e6aad1493604ab771db197cfeeea313f14cc6e9d1b6fc"


def test_the_legacy_upgrade_is_frozen() -> None:
    digest = hashlib.sha256(legacy_upgrade_sql().encode()).hexdigest()
    assert digest == LEGACY_SHA256, (
        "slawatch/sql/legacy_upgrade.sql changed: it is frozen; put schema changes in a new"
        " slawatch/sql/migrations/NNNN_name.sql (docs/contributing.md)"
    )


def test_printed_changes_take_the_lock_and_check_the_record() -> None:
    legacy, first = every_change()[:2]
    assert legacy == Change(migrations()[0], legacy=True) and first == Change(migrations()[0])
    for change, guard in (
        (first, "IF NOT EXISTS (SELECT 1 FROM slawatch.schema_version WHERE version = 1) THEN"),
        (legacy, "AND NOT EXISTS (SELECT 1 FROM slawatch.schema_version) THEN"),
    ):
        text = printed(change)
        assert text.startswith("-- ") and "\nDO $migration$\n" in text
        assert "PERFORM pg_advisory_xact_lock(1397506391);" in text
        assert guard in text
        assert change.sql.strip() in text
        assert text.endswith("VALUES (1, 'initial', now());\nEND IF;\nEND\n$migration$;")
