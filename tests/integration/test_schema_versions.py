"""slawatch's own schema as versioned migrations, on a real PostgreSQL: a fresh install
and a database of any older release end alike, rows survive, each migration runs once
even with migrators racing, and a later migration is one more file."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from slawatch.db import connect, with_database
from slawatch.engine import schema
from slawatch.engine.migrate import migrate, schema_current
from slawatch.engine.queries import legacy_upgrade_sql
from slawatch.engine.schema import Change, parse_migrations
from tests.integration.helpers import Conn

# Tests of migrating: each test's database starts empty (tests/conftest.py).
pytestmark = pytest.mark.empty_database

# Every migration slawatch ships, and the number a test's own extra one takes.
ALL = [(m.version, m.name) for m in schema.migrations()]
# migrate's line for the outbox's conversion into id ranges (0015_rotate.sql), after
# the migrations: "(N rows)" copied follows it.
CONVERTED = "slawatch.alert, slawatch.delivery: converted into id ranges"
APPLIED = [
    *(f"slawatch's schema: applied {m.filename}" for m in schema.migrations()),
    f"{CONVERTED} (0 rows)",
]


def copied(lines: list[str]) -> list[str]:
    """migrate's lines with the number of rows its conversion copied left out."""
    return [f"{CONVERTED} (0 rows)" if line.startswith(CONVERTED) else line for line in lines]


NEXT = len(ALL) + 1

NOW = datetime(2026, 3, 1, tzinfo=UTC)

# Older shapes of slawatch's schema, as releases before versioning left them; each is
# built on top of what the previous release's schema.sql (legacy_upgrade.sql) makes.
FIRST_RELEASE = """
DROP SCHEMA slawatch CASCADE;
CREATE SCHEMA slawatch;
CREATE TABLE slawatch.alert (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, rule text NOT NULL,
    key text NOT NULL, n integer NOT NULL, severity text NOT NULL,
    deadline timestamptz, due_at timestamptz, fired_at timestamptz NOT NULL,
    row_data jsonb NOT NULL, CONSTRAINT alert_once UNIQUE (rule, key, n));
CREATE TABLE slawatch.delivery (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, alert_id bigint NOT NULL,
    notifier text NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL,
    lease_owner uuid, lease_expires_at timestamptz, last_error text, sent_at timestamptz,
    CONSTRAINT delivery_once UNIQUE (alert_id, notifier));
CREATE INDEX delivery_due ON slawatch.delivery (notifier, next_attempt_at)
    WHERE status = 'pending';
"""
BEFORE_SILENCES = """
DROP TABLE slawatch.ack, slawatch.silence, slawatch.scan, slawatch.baseline;
DROP INDEX slawatch.delivery_summary, slawatch.delivery_dead;
ALTER TABLE slawatch.alert DROP COLUMN kind;
ALTER TABLE slawatch.delivery DROP COLUMN summary_id, DROP CONSTRAINT delivery_status;
ALTER TABLE slawatch.delivery ADD CHECK (status IN ('pending', 'sent', 'dead'));
"""
BEFORE_STORMS = """
DROP INDEX slawatch.delivery_summary;
ALTER TABLE slawatch.delivery DROP COLUMN summary_id, DROP CONSTRAINT delivery_status;
ALTER TABLE slawatch.delivery ADD CONSTRAINT delivery_status
    CHECK (status IN ('pending', 'sent', 'dead', 'silenced'));
ALTER TABLE slawatch.alert DROP CONSTRAINT alert_kind;
ALTER TABLE slawatch.alert ADD CONSTRAINT alert_kind CHECK (kind IN ('firing', 'resolved'));
"""
OLDER = {
    "previous release": "",
    "before storms": BEFORE_STORMS,
    "before silences": BEFORE_SILENCES,
    "first release": FIRST_RELEASE,
}


def previous_release(conn: Conn, reshape: str = "") -> None:
    """slawatch's schema as the release before versioning made it (its schema.sql,
    run as its migrate ran it), then ``reshape``d into an older release's."""
    conn.execute(legacy_upgrade_sql().encode())
    if reshape:
        conn.execute(reshape.encode())
    assert conn.execute("SELECT to_regclass('slawatch.schema_version')").fetchone() == (None,)


def catalog(conn: Conn) -> dict[str, Any]:
    """slawatch's schema as the catalog describes it: relations, columns (by name: an
    upgrade appends where a fresh table has them in place), constraints and indexes by
    definition. NOT VALID is ignored: an upgrade adds a CHECK that way on purpose. The
    outbox's partitions (0015_rotate.sql's id ranges: one per day of an upgraded
    history) and their indexes are left out: the partitioned tables stand for them."""
    ns = "n.nspname = 'slawatch' AND NOT c.relispartition"
    relations = conn.execute(
        "SELECT c.relname, c.relkind FROM pg_class c"
        f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {ns} ORDER BY 1"
    ).fetchall()
    columns = conn.execute(
        "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
        " pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attcollation"
        " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        f" WHERE {ns} AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY 1, 2"
    ).fetchall()
    constraints = conn.execute(
        "SELECT c.relname, k.conname, k.contype,"
        " replace(pg_get_constraintdef(k.oid), ' NOT VALID', '')"
        " FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
        f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {ns} ORDER BY 1, 2"
    ).fetchall()
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'slawatch'"
        " AND NOT (SELECT relispartition FROM pg_class"
        " WHERE oid = format('%I.%I', schemaname, tablename)::regclass) ORDER BY 1"
    ).fetchall()
    return {
        "relations": relations,
        "columns": columns,
        "constraints": constraints,
        "indexes": indexes,
    }


def versions(conn: Conn) -> list[tuple[int, str]]:
    return [
        (int(v), str(n))
        for v, n in conn.execute(
            "SELECT version, name FROM slawatch.schema_version ORDER BY version"
        ).fetchall()
    ]


@pytest.fixture(scope="module")
def fresh(server_dsn: str) -> Iterator[dict[str, Any]]:
    """The catalog of a fresh install, made once in a database of its own."""
    import psycopg
    from psycopg import sql

    db = f"slawatch_test_{uuid.uuid4().hex[:12]}"
    name = sql.Identifier(db)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(name))
    try:
        with connect(with_database(server_dsn, db)) as conn:
            assert migrate(conn, []) == APPLIED
            yield catalog(conn)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


@pytest.mark.parametrize("shape", list(OLDER))
def test_an_older_release_is_brought_to_what_a_fresh_install_has(
    conn: Conn, fresh: dict[str, Any], shape: str
) -> None:
    previous_release(conn, OLDER[shape])
    assert not schema_current(conn)
    assert copied(migrate(conn, [])) == [
        "slawatch's schema: upgraded from before versioned migrations (legacy_upgrade.sql),"
        " recorded as 0001_initial.sql",
        *APPLIED[1:],
    ]
    assert schema_current(conn)
    assert versions(conn) == ALL
    have = catalog(conn)
    for part in fresh:
        assert have[part] == fresh[part], part
    assert migrate(conn, []) == []  # and it stays upgraded


def test_rows_of_the_previous_release_are_all_kept(conn: Conn) -> None:
    previous_release(conn)
    for statement in (
        """INSERT INTO slawatch.alert (rule, key, episode, n, severity, deadline, due_at,
                                       fired_at, row_data, kind)
           VALUES ('late', '1', 1, 1, 'warning', %(t)s, %(t)s, %(t)s, '{"id": 1}', 'firing'),
                  ('late', '1', 1, 0, 'warning', %(t)s, %(t)s, %(t)s, '{"id": 1}', 'resolved'),
                  ('late', 'storm:console:1', 0, 0, 'info', NULL, NULL, %(t)s, '{}', 'summary')
        """,
        """INSERT INTO slawatch.delivery (alert_id, notifier, status, attempts,
                                          next_attempt_at, last_error, sent_at, summary_id)
           VALUES (1, 'console', 'sent', 1, %(t)s, NULL, %(t)s, NULL),
                  (1, 'hook', 'dead', 5, %(t)s, 'HTTP 500', NULL, NULL),
                  (2, 'console', 'silenced', 0, %(t)s, NULL, NULL, NULL),
                  (2, 'hook', 'summarized', 0, %(t)s, NULL, NULL, 3),
                  (3, 'hook', 'pending', 0, %(t)s, NULL, NULL, NULL)
        """,
        "INSERT INTO slawatch.ack VALUES ('late', '1', 1, 1, %(t)s, 'ann', 'on it')",
        """INSERT INTO slawatch.silence (rule, key, matchers, starts_at, ends_at, created_at,
                                         author, comment)
           VALUES ('late', NULL, '{"id": 1}', %(t)s, %(t)s + interval '1 hour', %(t)s,
                   'bo', 'x')
        """,
        "INSERT INTO slawatch.watermark VALUES ('late', %(t)s, %(t)s)",
        "INSERT INTO slawatch.scan VALUES ('late', %(t)s, 12, 3, NULL)",
        "INSERT INTO slawatch.baseline VALUES ('late', 1000, %(t)s)",
    ):
        conn.execute(statement, {"t": NOW})
    tables = ["alert", "delivery", "ack", "silence", "watermark", "scan", "baseline"]

    def rows() -> dict[str, list[Any]]:
        return {
            t: conn.execute(
                f"SELECT to_jsonb(r) FROM slawatch.{t} r ORDER BY to_jsonb(r)::text".encode()
            ).fetchall()
            for t in tables
        }

    before = rows()
    assert all(before.values())
    migrate(conn, [])
    assert rows() == before
    # The identities go on from where they were.
    (new_id,) = conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " VALUES ('late', '2', 1, 1, 'warning', %s, '{}') RETURNING id",
        (NOW,),
    ).fetchone() or (None,)
    assert new_id == 4


def test_a_second_migrate_has_nothing_to_do(conn: Conn) -> None:
    assert not schema_current(conn)
    assert migrate(conn, []) == APPLIED
    assert schema_current(conn)
    assert schema.pending(conn) == []
    assert migrate(conn, []) == []
    assert versions(conn) == ALL
    (applied_at,) = conn.execute("SELECT applied_at FROM slawatch.schema_version").fetchone() or ()
    assert applied_at is not None


def test_a_change_planned_by_two_migrators_is_applied_by_one(conn: Conn) -> None:
    """Both planned 0001 before either applied it: the second finds it recorded, under
    the lock, and does nothing (no error)."""
    (first, *_) = schema.pending(conn)
    (second, *_) = schema.pending(conn)
    assert schema.apply(conn, first, NOW) is True
    assert schema.apply(conn, second, NOW) is False
    assert versions(conn) == [(1, "initial")]


TABLE = "CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, paid_at timestamptz)"


def _race(dsn: str, work: Any, n: int = 4, plan: Any = lambda c: None) -> list[Any]:
    """``work(conn, plan(conn))`` in ``n`` threads, each on its own connection, the
    plans made first and the work started together; every result, or the test fails
    with the errors."""
    barrier = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with connect(dsn) as c:
                planned = plan(c)
                barrier.wait(timeout=30)
                results.append(work(c, planned))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    return results


def late_rule() -> Any:
    from slawatch.config.rules import Rule

    return Rule.model_validate(
        {
            "name": "late",
            "table": "public.orders",
            "key": "id",
            "deadline": "paid_at",
            "after": "1h",
            "open_when": "status = 'paid'",
            "notify": ["console"],
        }
    )


def test_concurrent_migrates_apply_each_migration_exactly_once(conn: Conn, dsn: str) -> None:
    conn.execute(TABLE)
    late = late_rule()
    results = _race(dsn, lambda c, _: migrate(c, [late]))
    done = sorted(results, key=len)
    assert done[:-1] == [[]] * (len(done) - 1)  # the others waited, then found it done
    assert done[-1][0] == "slawatch's schema: applied 0001_initial.sql"
    assert versions(conn) == ALL
    assert migrate(conn, [late]) == []


def test_concurrent_schema_changes_apply_once(conn: Conn, dsn: str) -> None:
    """A change takes the lock itself: migrators that all checked their rules (which
    leaves temporary tables in the session) and planned 0001, without migrate's hold of
    the lock around them, apply it once; the others find it recorded, and none takes
    the schema made meanwhile for absent."""
    from slawatch.engine.migrate import check

    conn.execute(TABLE)
    late = late_rule()

    def plan(c: Conn) -> list[Change]:
        check(c, [late])
        return schema.pending(c)

    results = _race(dsn, lambda c, planned: schema.apply(c, planned[0], NOW), plan=plan)
    assert sorted(results) == [False, False, False, True]
    assert versions(conn) == [(1, "initial")]


def _with_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """slawatch as it will be once a second migration file ships."""
    files = {m.filename: m.sql for m in schema.migrations()}
    files[f"{NEXT:04d}_add_example.sql"] = (
        "CREATE TABLE slawatch.example (id text PRIMARY KEY, seen_at timestamptz NOT NULL);"
    )
    monkeypatch.setattr(schema, "migrations", lambda: parse_migrations(files))


def test_a_later_migration_is_applied_after_the_first(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(conn, [])
    _with_next(monkeypatch)
    assert not schema_current(conn)
    assert migrate(conn, []) == [f"slawatch's schema: applied {NEXT:04d}_add_example.sql"]
    assert versions(conn) == [*ALL, (NEXT, "add_example")]
    assert schema_current(conn)
    assert migrate(conn, []) == []


def test_a_previous_release_gets_the_legacy_upgrade_then_the_later_migrations(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous_release(conn, BEFORE_STORMS)
    _with_next(monkeypatch)
    first, *later = schema.migrations()
    assert schema.pending(conn) == [Change(first, legacy=True), *(Change(m) for m in later)]
    assert [line.split(": ", 1)[1] for line in copied(migrate(conn, []))] == [
        "upgraded from before versioned migrations (legacy_upgrade.sql),"
        " recorded as 0001_initial.sql",
        *(line.split(": ", 1)[1] for line in APPLIED[1:-1]),
        f"applied {NEXT:04d}_add_example.sql",
        APPLIED[-1].split(": ", 1)[1],
    ]
    assert versions(conn) == [*ALL, (NEXT, "add_example")]
    assert conn.execute("SELECT to_regclass('slawatch.example')").fetchone() == (
        "slawatch.example",
    )


@pytest.mark.parametrize(
    ("broken", "error"),
    [
        # The migration fails half way.
        ("ALTER TABLE slawatch.nope ADD COLUMN x int;", 'relation "slawatch.nope" does not exist'),
        # The migration runs, and then its record cannot be written.
        (
            f"ALTER TABLE slawatch.schema_version ADD CONSTRAINT up_to_1 CHECK (version < {NEXT});",
            'violates check constraint "up_to_1"',
        ),
    ],
)
def test_a_failing_migration_changes_nothing(
    conn: Conn, monkeypatch: pytest.MonkeyPatch, broken: str, error: str
) -> None:
    """A migration and its record commit together: one that fails leaves no trace."""
    from slawatch.errors import DatabaseError

    migrate(conn, [])
    files = {m.filename: m.sql for m in schema.migrations()}
    files[f"{NEXT:04d}_broken.sql"] = "CREATE TABLE slawatch.half (id int);\n" + broken
    monkeypatch.setattr(schema, "migrations", lambda: parse_migrations(files))
    with pytest.raises(DatabaseError) as caught:
        migrate(conn, [])
    assert str(caught.value).startswith(
        f"migrate: slawatch's schema: applied {NEXT:04d}_broken.sql: "
    )
    assert error in str(caught.value)
    assert versions(conn) == ALL
    assert conn.execute("SELECT to_regclass('slawatch.half')").fetchone() == (None,)
    assert conn.execute(
        "SELECT count(*) FROM pg_constraint WHERE conname = 'up_to_1'"
    ).fetchone() == (0,)
    assert not schema_current(conn)


def without_grants(script: str) -> str:
    """A printed script up to its GRANTs (which need a role of the cluster)."""
    lines = script.split("-- Least privilege")[0].splitlines()
    while lines and (not lines[-1].strip() or lines[-1].startswith("--")):
        lines.pop()  # the comments before it
    return "\n".join(lines)


def test_printed_against_a_database_is_only_its_pending_changes(
    conn: Conn, fresh: dict[str, Any]
) -> None:
    """migrate --print with a database: a fresh one gets 0001, one of an older release
    the legacy upgrade (recorded as 0001), a current one nothing; each script, run as
    psql would, leaves what migrate would."""
    from slawatch.engine.migrate import plan, render
    from tests.integration.test_migrate import run_script

    script = render([], plan(conn, []))
    assert "-- 0001_initial.sql, unless it is recorded" in script
    assert "-- legacy_upgrade.sql" not in script
    run_script(conn, without_grants(script))
    assert schema_current(conn) and versions(conn) == ALL
    assert catalog(conn) == fresh
    assert plan(conn, []) == []
    assert "slawatch's schema" not in render([], [])

    conn.execute("DROP SCHEMA slawatch CASCADE")
    previous_release(conn, BEFORE_SILENCES)
    script = render([], plan(conn, []))
    assert "-- legacy_upgrade.sql: only on a database made before" in script
    assert "0001_initial.sql, unless it is recorded" not in script
    run_script(conn, without_grants(script))
    assert schema_current(conn) and versions(conn) == ALL
    assert catalog(conn) == fresh


@pytest.mark.parametrize("shape", ["new database", *OLDER])
def test_printed_without_a_database_fits_a_database_of_any_release(
    conn: Conn, fresh: dict[str, Any], shape: str
) -> None:
    """The script made without a database has the legacy upgrade and every migration,
    each guarded by the record: on a new database, an older release's or (run again)
    a current one, it ends where migrate would."""
    from slawatch.engine.migrate import render
    from tests.integration.test_migrate import run_script

    if shape != "new database":
        previous_release(conn, OLDER[shape])
    script = render([])
    for _ in range(2):
        run_script(conn, without_grants(script))
        assert versions(conn) == ALL
        assert catalog(conn) == fresh
        assert migrate(conn, []) == []
