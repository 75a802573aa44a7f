"""migrate and check against a real database: DDL, idempotence, rebuilds, bad rules."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from slawatch.cli import main
from slawatch.config.rules import Rule
from slawatch.engine import migrate as migrate_module
from slawatch.engine.catalog import IndexProbe, Probed, inspect_table
from slawatch.engine.migrate import check, migrate, pending, render, with_probed_indexes
from slawatch.engine.ready import prepare_ready
from slawatch.errors import ConfigError
from tests.integration.helpers import Conn, role_slawatch_app, shop

# Tests of migrating: each test's database starts empty (tests/conftest.py).
pytestmark = pytest.mark.empty_database

# The printed script grants to the role slawatch_app, which a test creates and drops:
# roles are cluster-wide, so under xdist these tests run on one worker
# (the same group in test_track_switch.py).
ROLE_APP = pytest.mark.xdist_group("role_slawatch_app")


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
    assert "public.orders: added sw_late_n, sw_late_next, sw_late_seen, sw_late_ep" in done
    assert {"sw_late_n", "sw_late_next", "sw_late_seen", "sw_late_ep"} <= columns(conn)
    idx = indexes(conn)
    assert idx["sw_late_first"].endswith(
        "(paid_at) WHERE ((sw_late_seen IS DISTINCT FROM paid_at) AND (status = 'paid'::text))"
    )
    # Every open episode, whether a re-notification is scheduled or not (issue 13: so
    # that `status` counts notified rows still overdue through an index).
    assert idx["sw_late_again"].endswith(
        "(sw_late_next) WHERE ((sw_late_seen = paid_at) AND (status = 'paid'::text))"
    )
    assert idx["sw_late_ended"].endswith(
        "(sw_late_seen) WHERE ((sw_late_seen IS NOT NULL) AND ((sw_late_seen IS DISTINCT FROM"
        " paid_at) OR ((status = 'paid'::text) IS NOT TRUE)))"
    )
    tables = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'slawatch'"
        " AND NOT (SELECT relispartition FROM pg_class"
        " WHERE oid = format('slawatch.%I', table_name)::regclass)"  # the outbox's id ranges
    ).fetchall()
    assert {t[0] for t in tables} == {
        "alert",
        "delivery",
        "watermark",
        "ack",
        "silence",
        "scan",
        "baseline",
        "schema_version",  # issue 14: the record of applied migrations
        "session",
        "event_seen",  # issue 15: event ids seen (dedupe)
        "action",  # issue 16: every attempt of a rule's action
        "episode",  # issue 17: the episode history the SLA report reads
        "event_held",  # issue 24: events of types no rule knew yet
        "rule_generation",  # issue 24: each rule's recorded definition (engine/generation.py)
        "scanner",  # issue 24: when each process last scanned each rule
        "history_range",  # issue 27: the outbox's id ranges (0015_rotate.sql)
        "history_convert",  # issue 27: the outbox's conversion into them
        "outbox_row",  # issue 27: the outbox in rows of alerts (0020_outbox_rows.sql)
        "outbox_send",  # issue 27: each row's delivery to each of its notifiers
    }


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
        ({"key": "ref"}, "key: (ref) of public.orders has no unique index on those columns"),
        ({"key": ["ref", "note"]}, "key: (ref, note) of public.orders has no unique index"),
        ({"key": "code"}, "key: column 'code' of public.orders may be NULL"),
        ({"deadline": "paid_on"}, "deadline: column 'paid_on' is date; it must be timestamp"),
        ({"deadline": "nope"}, "deadline: column 'nope' not in public.orders"),
        ({"columns": ["id", "total"]}, "columns: column 'total' not in public.orders"),
        ({"open_when": "statuz = 'paid'"}, 'open_when: column "statuz" does not exist'),
        ({"open_when": "paid_at < now()"}, "open_when: functions in index predicate must be"),
        ({"open_when": "status"}, "open_when: argument of WHERE must be type boolean"),
        ({"open_when": "random() < 0.5"}, "open_when: functions in index predicate must be"),
        ({"open_when": "status = 'paid'"}, None),
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


DOLLAR_QUOTE = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")


def run_script(conn: Conn, script: str) -> None:
    """Run a printed migration as psql would: statement by statement (CONCURRENTLY
    cannot run inside a transaction), a dollar-quoted block ($$ or $tag$, which may
    hold $$ blocks) being one statement."""
    statement: list[str] = []
    quote: str | None = None  # the dollar quote open at the end of the line
    for line in script.splitlines():
        if line.startswith("--") and not statement:
            continue
        statement.append(line)
        for tag in DOLLAR_QUOTE.findall(line):
            if quote is None:
                quote = tag
            elif tag == quote:
                quote = None
        if line.rstrip().endswith(";") and quote is None:
            conn.execute("\n".join(statement).encode())
            statement = []
    assert not "\n".join(statement).strip()


@ROLE_APP
def test_printed_migration_runs_as_is(conn: Conn) -> None:
    """What --print shows without a database is what a DBA can run, and it is
    equivalent to migrate, whatever state the database was in."""
    conn.execute(TABLE)
    script = render([rule()])
    assert (
        'GRANT UPDATE ("sw_late_n", "sw_late_next", "sw_late_seen", "sw_late_ep")'
        ' ON "public"."orders"' in script
    )
    with role_slawatch_app(conn):
        run_script(conn, script)
        assert {"sw_late_first", "sw_late_again", "sw_late_ended"} == set(indexes(conn))
        assert migrate(conn, [rule()]) == []
        # Applied again, after a change of the rule: it still ends where migrate would.
        changed = rule(open_when="status IN ('paid', 'packed')")
        run_script(conn, render([changed]))
        assert migrate(conn, [changed]) == []
        assert "'packed'" in indexes(conn)["sw_late_first"]


@ROLE_APP
def test_printed_against_the_database_is_only_the_change(conn: Conn) -> None:
    """The DBA path after a rule change: the plan drops and rebuilds what changed, and
    after it is applied by hand, migrate and run agree that all is well."""
    from slawatch.engine.migrate import plan
    from slawatch.engine.ready import prepare

    conn.execute(TABLE)
    migrate(conn, [rule()])
    assert plan(conn, [rule()]) == []
    assert "nothing to change" in render([rule()], [])
    changed = rule(open_when="status IN ('paid', 'packed')")
    script = render([changed], plan(conn, [changed]))
    assert 'DROP INDEX CONCURRENTLY IF EXISTS "public"."sw_late_first";' in script
    assert 'CREATE INDEX CONCURRENTLY "sw_late_first"' in script
    assert "ADD COLUMN" not in script  # the columns are there already
    with pytest.raises(ConfigError, match="not migrated or changed since the last migrate"):
        prepare(conn, changed)
    with role_slawatch_app(conn):
        run_script(conn, script)
    assert migrate(conn, [changed]) == []
    prepare(conn, changed)


def test_an_index_that_differs_is_found_from_the_catalog(conn: Conn) -> None:
    """Drift is read from the index itself, not a label: an index of the right name
    with another predicate, or on another table, is rebuilt."""
    conn.execute(TABLE)
    migrate(conn, [rule()])
    conn.execute("DROP INDEX sw_late_first")
    conn.execute("CREATE INDEX sw_late_first ON orders (paid_at) WHERE status = 'shipped'")
    assert migrate(conn, [rule()]) == [
        "public.orders: dropped index sw_late_first (definition changed)",
        "public.orders: built index sw_late_first",
    ]
    conn.execute("DROP INDEX sw_late_again")
    conn.execute("CREATE TABLE other (LIKE orders INCLUDING ALL)")
    conn.execute(
        "CREATE INDEX sw_late_again ON other (sw_late_next) WHERE sw_late_next IS NOT NULL"
        " AND sw_late_seen = paid_at AND (status = 'paid')"
    )
    assert migrate(conn, [rule()]) == [
        "public.orders: dropped index sw_late_again (on another table (public.other))",
        "public.orders: built index sw_late_again",
    ]
    assert migrate(conn, [rule()]) == []


def test_upgrade_from_before_episodes_keeps_notified_rows_quiet(conn: Conn) -> None:
    """A table migrated before episodes existed: rows already notified become episode 1
    of their deadline, so the upgrade pages nobody again."""
    from datetime import timedelta

    from slawatch.engine.ready import prepare
    from tests.integration.helpers import claim_all, episodes

    conn.execute(TABLE)
    conn.execute(
        "ALTER TABLE orders ADD COLUMN sw_late_n integer NOT NULL DEFAULT 0,"
        " ADD COLUMN sw_late_next timestamptz"
    )
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    conn.execute(
        "INSERT INTO orders (id, status, paid_at, sw_late_n) VALUES"
        " (1, 'paid', %(t)s, 1), (2, 'paid', %(t)s, 0)",
        {"t": t0},
    )
    done = migrate(conn, [rule()])
    assert "public.orders: notified rows became episode 1" in done
    assert claim_all(conn, prepare(conn, rule()), t0 + timedelta(days=1)) == 1  # only row 2
    assert episodes(conn, rule().name) == [("2", 1, 1)]


def test_shop_migrates(conn: Conn) -> None:
    rules = shop(conn)
    assert len(rules) == 6


def test_percent_sign_in_condition_is_literal(conn: Conn) -> None:
    """open_when is SQL text: a LIKE pattern's % must not be taken for a parameter."""
    from datetime import UTC, datetime, timedelta

    from slawatch.engine.claim import plan_claim
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

    from slawatch.engine.claim import claim_batch
    from slawatch.engine.migrate import grants
    from slawatch.engine.ready import prepare

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
    from slawatch.engine.ready import prepare

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


def test_a_server_reading_backslashes_otherwise_is_refused(conn: Conn, dsn: str) -> None:
    """open_when is parsed with standard_conforming_strings on; a server with it off would
    read a literal like 'a\\' differently, so slawatch refuses to work with it."""
    import psycopg

    conn.execute(TABLE)
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SET standard_conforming_strings = off")
        with pytest.raises(ConfigError, match="standard_conforming_strings = off"):
            migrate(other, [rule()])


def test_adding_columns_does_not_queue_the_application_behind_a_long_transaction(
    conn: Conn, dsn: str
) -> None:
    """ALTER TABLE waits at most LOCK_TIMEOUT for its lock (then fails, changing nothing):
    while it waits, every query of the application on that table waits behind it."""
    import psycopg

    conn.execute(TABLE)
    conn.execute("SET statement_timeout = '30s'")  # without the bound: a failure, not a hang
    with psycopg.connect(dsn) as reader:  # a long report holds ACCESS SHARE
        reader.execute("SELECT count(*) FROM orders")
        with pytest.raises(Exception, match="lock timeout"):
            migrate(conn, [rule()])
        reader.rollback()
    assert not {c for c in columns(conn) if c.startswith("sw_")}
    assert migrate(conn, [rule()])  # and it goes through once the report is done


def test_printed_locks_are_bounded_but_concurrent_builds_are_not() -> None:
    """In the DBA's script a lock_timeout bounds exactly the statements that take strong
    locks; CREATE INDEX CONCURRENTLY may wait for old transactions as long as it needs."""
    script = render([rule()])
    bounded = False
    for line in script.splitlines():
        if line.startswith("SET lock_timeout"):
            bounded = True
        elif line.startswith("RESET lock_timeout"):
            bounded = False
        elif "CONCURRENTLY" in line:
            assert not bounded, line
        elif line.startswith('ALTER TABLE "public"'):  # the watched table
            assert bounded, line


def test_a_table_loaded_from_a_dump_is_analyzed_so_explain_passes(conn: Conn, track: str) -> None:
    """A dump restored, then migrate: the rows are there but no statistics. migrate
    ANALYZEs the table it indexed, so `explain` (and the first scans) plan with them."""
    from slawatch.engine.migrate import plan
    from slawatch.operate.explain import explain

    now = datetime(2026, 3, 1, tzinfo=UTC)
    conn.execute(TABLE)
    # Only migrate may analyze it here: autovacuum could come by during the test.
    conn.execute("ALTER TABLE orders SET (autovacuum_enabled = false)")
    conn.execute(
        "INSERT INTO orders (id, status, paid_at) SELECT g, CASE WHEN mod(g, 100) = 0"
        " THEN 'paid' ELSE 'shipped' END, %s - g * interval '1 minute'"
        " FROM generate_series(1, 50000) g",
        (now,),
    )
    # As pg_restore does, an index built after the data: it counts the rows (reltuples),
    # but writes no column statistics.
    conn.execute("CREATE INDEX orders_ref ON orders (ref)")
    late = rule(track=track)
    printed = render([late], plan(conn, [late]))
    assert 'ANALYZE "public"."orders";' in printed
    done = migrate(conn, [late])
    assert "public.orders: analyzed: it had no statistics, which the claim's plan needs" in done
    result = explain(conn, late, now)
    assert result.ok, result.verdict
    # Statistics there: a later rebuild of an index does not analyze again.
    changed = rule(track=track, open_when="status IN ('paid', 'packed')")
    assert not [d for d in migrate(conn, [changed]) if "analyzed" in d]


def test_an_analyzed_table_is_analyzed_again_for_its_new_tracking_columns(conn: Conn) -> None:
    """The first migrate of an inline rule on a live table (analyzed long ago): the
    tracking columns it adds have no statistics, and without them the claim's `ended`
    read and the probe's were planned as a sequential scan of the whole table (the
    planner expects half the rows to match). migrate analyzes it once."""
    conn.execute(TABLE)
    conn.execute("ALTER TABLE orders SET (autovacuum_enabled = false)")
    conn.execute(
        "INSERT INTO orders (id, status, paid_at) SELECT g, 'shipped',"
        " '2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 20000) g"
    )
    conn.execute("ANALYZE orders")
    late = rule()
    done = migrate(conn, [late])
    assert (
        "public.orders: analyzed: no statistics of its tracking columns yet, which the"
        " claim's plan needs" in done
    )
    columns = conn.execute(
        "SELECT attname FROM pg_stats WHERE tablename = 'orders' AND attname = ANY(%s)"
        " ORDER BY attname",
        (late.tracking_columns,),
    ).fetchall()
    assert sorted(c for (c,) in columns) == sorted(late.tracking_columns)
    seen = late.seen_column
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            f'EXPLAIN SELECT EXISTS (SELECT 1 FROM orders WHERE "{seen}" IS NOT NULL'
            f" AND (\"{seen}\" IS DISTINCT FROM paid_at OR (status = 'paid') IS NOT TRUE))"
        ).fetchall()
    )
    assert "Seq Scan" not in plan, plan
    # Once they have statistics, a rebuild of an index does not analyze again.
    changed = rule(open_when="status IN ('paid', 'packed')")
    assert not [d for d in migrate(conn, [changed]) if "analyzed" in d]


def test_the_claim_reads_ended_episodes_through_their_index_without_statistics(
    conn: Conn,
) -> None:
    """Statistics of the tracking columns gone (or never there: autovacuum off, a
    migrate from before they were analyzed): the claim's `ended` read still takes its
    partial index (ordered by its key), not a sequential scan of the table that stops
    early only when there are ended rows to find."""
    from slawatch.engine.ready import prepare

    conn.execute(TABLE)
    conn.execute("ALTER TABLE orders SET (autovacuum_enabled = false)")
    conn.execute(
        "INSERT INTO orders (id, status, paid_at) SELECT g, 'shipped',"
        " '2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 20000) g"
    )
    late = rule()
    migrate(conn, [late])
    conn.execute(
        "DELETE FROM pg_statistic WHERE starelid = 'orders'::regclass AND staattnum IN"
        " (SELECT attnum FROM pg_attribute WHERE attrelid = 'orders'::regclass"
        "  AND attname = ANY(%s))",
        (late.tracking_columns,),
    )
    plan = prepare(conn, late)
    with conn.transaction(force_rollback=True):
        text = "\n".join(
            r[0]
            for r in conn.execute(
                psycopg.sql.SQL("EXPLAIN {}").format(plan.statement),
                plan.params(datetime(2026, 3, 1, tzinfo=UTC)),
            ).fetchall()
        )
    assert "Seq Scan on orders" not in text, text
    assert f"Index Scan using {late.ended_index} on orders" in text, text


def test_the_partitions_that_hold_rows_without_statistics_are_analyzed(conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE orders (id bigint, status text NOT NULL, paid_at timestamptz NOT NULL,"
        " PRIMARY KEY (id, paid_at)) PARTITION BY RANGE (paid_at);"
        " CREATE TABLE orders_2025 PARTITION OF orders"
        " FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');"
        " CREATE TABLE orders_2026 PARTITION OF orders"
        " FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');"
        " CREATE TABLE orders_2027 PARTITION OF orders"
        " FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')"
    )
    conn.execute(
        "INSERT INTO orders SELECT g, 'paid', '2025-06-01'::timestamptz + g * interval '1 hour'"
        " FROM generate_series(1, 10000) g"
    )
    conn.execute("ANALYZE orders_2025")  # analyzed already: left alone
    done = migrate(conn, [rule(key=["id", "paid_at"])])
    # 2026 got rows from the load, 2027 is empty (nothing to analyze).
    assert "public.orders: analyzed (1 partition): it had no statistics, which the claim's" in (
        " ".join(done)
    )
    analyzed = conn.execute(
        "SELECT DISTINCT tablename FROM pg_stats WHERE tablename LIKE 'orders_%' ORDER BY tablename"
    ).fetchall()
    assert analyzed == [("orders_2025",), ("orders_2026",)]


def test_a_database_at_0001_is_brought_to_issue_13s_schema_without_loss(
    conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13's migration (0002): delivery_status gains 'acknowledged' and 'orphaned'
    (replaced NOT VALID), orphaned deliveries and acks get their indexes, and the page's
    sessions their table; the rows already there are kept."""
    from slawatch.engine import schema
    from slawatch.engine.migrate import schema_current

    shipped = schema.migrations()
    monkeypatch.setattr(schema, "migrations", lambda: shipped[:1])  # the previous release
    rules = list(shop(conn).values())
    conn.execute("""
        INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)
        VALUES ('order_unshipped', '1', 1, 1, 'warning', now(), '{}');
        INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)
        VALUES (1, 'a', 'sent', now()), (1, 'b', 'pending', now());
    """)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE slawatch.delivery SET status = 'orphaned' WHERE notifier = 'b'")
    monkeypatch.setattr(schema, "migrations", lambda: shipped)
    assert not schema_current(conn)  # `run` asks for a migrate instead of failing later
    migrate(conn, rules)
    assert schema_current(conn)
    conn.execute("UPDATE slawatch.delivery SET status = 'acknowledged' WHERE notifier = 'a'")
    conn.execute("UPDATE slawatch.delivery SET status = 'orphaned' WHERE notifier = 'b'")
    assert migrate(conn, rules) == []  # idempotent
    found = conn.execute(
        "SELECT to_regclass('slawatch.delivery_orphaned'), to_regclass('slawatch.ack_acked_at'),"
        " to_regclass('slawatch.session')"
    ).fetchone()
    assert found == ("slawatch.delivery_orphaned", "slawatch.ack_acked_at", "slawatch.session")
    assert conn.execute("SELECT count(*) FROM slawatch.delivery").fetchone() == (2,)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE slawatch.delivery SET status = 'lost'")


def test_a_migration_that_cannot_get_its_lock_fails_instead_of_queueing(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long transaction of a running instance holds slawatch.delivery: the migration
    gives up after its lock_timeout (rather than queue every instance's statements
    behind it), changes nothing, and the next migrate applies it."""
    from slawatch.engine import schema
    from slawatch.engine.migrate import schema_current
    from slawatch.errors import DatabaseError

    shipped = schema.migrations()
    monkeypatch.setattr(schema, "migrations", lambda: shipped[:1])
    rules = list(shop(conn).values())
    monkeypatch.setattr(schema, "migrations", lambda: shipped)
    with psycopg.connect(dsn) as other:  # a transaction left open, as by a claim
        other.execute("LOCK TABLE slawatch.delivery IN ROW EXCLUSIVE MODE")
        with pytest.raises(DatabaseError, match="lock timeout"):
            migrate(conn, rules)
        assert not schema_current(conn)
        assert conn.execute("SELECT to_regclass('slawatch.session')").fetchone() == (None,)
    migrate(conn, rules)
    assert schema_current(conn)


def temp_tables(conn: Conn, work: Callable[[], object]) -> int:
    """The statements ``work()`` sends on ``conn`` that create a temporary table."""
    sent: list[str] = []

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            sent.append(query.as_string(self) if isinstance(query, sql.Composable) else str(query))
            return super().execute(query, params, **kwargs)

    conn.cursor_factory = Recording
    try:
        work()
    finally:
        conn.cursor_factory = psycopg.Cursor
    return sum("CREATE TEMP TABLE" in s for s in sent)


@pytest.mark.parametrize("n", [1, 6])
def test_each_command_probes_a_tables_rules_on_one_copy_of_it(conn: Conn, n: int) -> None:
    """The wanted indexes of all the rules of a table are built on one empty copy of it,
    once per command (check then each rule's pending, as 'slawatch check'; migrate; a
    start or reload of run): a copy per rule and use made 2,000 rules take minutes."""
    conn.execute(TABLE)
    rules = [
        rule(name=f"late{i}", open_when=f"status = 'paid' AND ref = '{i}'", track=track)
        for i, track in zip(range(n), itertools.cycle(["inline", "table"]), strict=False)
    ]

    def check_command() -> None:
        tables = check(conn, rules)
        for r in rules:
            pending(conn, r, tables[r.name])

    assert temp_tables(conn, check_command) == 1
    assert temp_tables(conn, lambda: migrate(conn, rules)) == 1
    assert temp_tables(conn, lambda: prepare_ready(conn, rules)) == 1
    assert prepare_ready(conn, rules)[1] == {}


def test_a_tables_rules_probed_together_get_the_answers_each_gets_alone(conn: Conn) -> None:
    """On the one copy, a rule PostgreSQL refuses gets its own error and the others
    their definitions; a rule's open_when sees its own tracking columns, not another
    rule's, which its table lacks; and check names each refused rule, only those."""
    conn.execute(TABLE)
    rules = [
        rule(name="a"),
        rule(name="b", open_when="paid_at < now()"),  # the index is refused
        rule(name="c", open_when="sw_a_n = 0"),  # a's column: only on a's copy
        rule(name="d", open_when="statuz = 'paid'"),  # the condition is refused
        rule(name="e", track="table", open_when="note LIKE '%x'"),
        rule(name="f", open_when="sw_f_n = 0"),  # its own column: on its copy
    ]
    for r in rules:
        r._source = f"rules/{r.name}.yaml"  # type: ignore[assignment]
    info = inspect_table(conn, "public", "orders")
    assert info is not None

    def answers(rs: list[Rule]) -> dict[str, Probed]:
        probed = with_probed_indexes(conn, [(r, info) for r in rs])
        out: dict[str, Probed] = {}
        for name, i in probed.items():
            assert i.probed_indexes is not None  # each rule's own answer
            out[name] = i.probed_indexes
        return out

    alone = {r.name: answers([r])[r.name] for r in rules}
    assert answers(rules) == alone
    assert [len(alone[r.name][0]) for r in rules] == [3, 0, 0, 0, 2, 3]
    assert "IMMUTABLE" in str(alone["b"][1])
    assert 'column "sw_a_n" does not exist' in str(alone["c"][1])
    assert 'column "statuz" does not exist' in str(alone["d"][1])
    with pytest.raises(ConfigError) as exc:
        check(conn, rules)
    assert [line.split(":")[0] for line in str(exc.value).splitlines()] == [
        "rules/b.yaml",
        "rules/c.yaml",
        "rules/d.yaml",
    ]


def test_migrate_baseline_probes_a_tables_rules_once(
    conn: Conn,
    dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`slawatch migrate --baseline` baselines with the tables its migrate checked and
    probed (a migrate changes no key, kind or deadline type): it checked them again,
    a second copy of each table for its rules' indexes."""
    conn.execute(TABLE)
    conn.execute("INSERT INTO orders (id, status, paid_at) VALUES (1, 'paid', '2026-01-01')")
    for i, track in enumerate(["inline", "table"]):
        (tmp_path / f"late{i}.yaml").write_text(
            "table: public.orders\nkey: id\ndeadline: paid_at\nafter: 1h\n"
            f"open_when: \"status = 'paid' AND ref IS DISTINCT FROM '{i}'\"\n"
            f"track: {track}\nnotify: [console]\n"
        )
    # An event rule: its timer table is made by this migrate, so read after it.
    (tmp_path / "parcel_late.yaml").write_text(
        "events: {start: shipped, stop: delivered, within: 1h}\nnotify: [console]\n"
    )
    probed: list[list[str]] = []
    probe = migrate_module.probe_table_indexes

    def counted(c: Conn, columns: dict[str, str], probes: list[IndexProbe]) -> list[Probed]:
        probed.append([p.rule.name for p in probes])
        return probe(c, columns, probes)

    monkeypatch.setattr(migrate_module, "probe_table_indexes", counted)
    monkeypatch.setenv("SLAWATCH_DSN", dsn)
    assert main(["--rules", str(tmp_path), "migrate", "--baseline"]) == 0
    # One copy of orders, once; the timer table's once, after the migrate made it.
    assert probed == [["late0", "late1"], ["parcel_late"]]
    out = capsys.readouterr().out
    assert "baseline: late0: 1 rows marked as seen" in out, out
    assert "baseline: late1: 1 rows marked as seen" in out, out
    assert "baseline: parcel_late: 0 rows marked as seen" in out, out
    assert main(["--rules", str(tmp_path), "migrate", "--baseline"]) == 0  # all read before
    assert probed[2:] == [["late0", "late1"], ["parcel_late"]]
