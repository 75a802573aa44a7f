"""Rules over a query (docs/reference/rules.md, ``query:``): a ``track: table`` rule
whose rows are one SELECT's output, read by a role that may only SELECT there.

procrastinate's stalled jobs (``status = 'doing'`` and the worker missing or its
heartbeat older than 5 minutes) and a shop's paid orders without a shipment
within 48 hours page, act and resolve through it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import yaml

from slawatch.actions.run import runner
from slawatch.cli import main
from slawatch.config.rules import Rule
from slawatch.engine.catalog import check_rule
from slawatch.engine.claim import ClaimPlan
from slawatch.engine.migrate import grants, migrate
from slawatch.engine.ready import prepare
from slawatch.engine.statetable import drain_table
from tests.conftest import ROOT
from tests.integration.helpers import (
    DAY,
    Conn,
    FixedClock,
    alerts,
    alerts_of,
    dsn_as,
    scratch_role,
)

STALLED = (
    "SELECT j.id, j.status, j.task, COALESCE(w.last_heartbeat, '-infinity') AS heartbeat"
    " FROM jobs j LEFT JOIN workers w ON w.id = j.worker_id"
)
UNSHIPPED = (
    "SELECT o.id, o.paid_at, o.customer FROM orders o"
    " WHERE o.status = 'paid'"
    " AND NOT EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = o.id)"
)


def resolved(conn: Conn, rule: str = "order_unshipped") -> list[tuple[str, int, list[str]]]:
    """(key, episode, [notifiers]) of every resolved notice of ``rule``, in either shape
    of the outbox (docs/explanation/outbox-rows.md)."""
    rows = alerts_of(conn, rule, "key", "episode", "notifiers", kind="resolved")
    return [(k, e, sorted(ns)) for k, e, ns in rows]


def stalled_rule() -> Rule:
    return Rule.model_validate(
        {
            "name": "job_stalled",
            "query": STALLED,
            "track": "table",
            "key": "id",
            "deadline": "heartbeat",
            "after": "5m",
            "open_when": "status = 'doing'",
            "columns": ["id", "task"],
            "notify": ["console"],
            "resolve": True,
            "action": {"sql": "update jobs set status = 'failed' where id = :id"},
        }
    )


def unshipped_rule(query: str = UNSHIPPED) -> Rule:
    return Rule.model_validate(
        {
            "name": "order_unshipped",
            "query": query,
            "track": "table",
            "key": "id",
            "deadline": "paid_at",
            "after": "48h",
            "open_when": "true",
            "columns": ["customer"],
            "notify": ["console"],
            "resolve": True,
        }
    )


@pytest.fixture
def role(conn: Conn, dsn: str) -> Iterator[tuple[str, str]]:
    """A login role holding nothing yet, and a DSN that connects as it. NOINHERIT: the
    actions' role it may SET ROLE to lends it nothing while it watches."""
    with scratch_role(conn, "slawatch_q", "LOGIN NOINHERIT") as name:
        yield name, dsn_as(dsn, name)


@pytest.fixture
def action_role(conn: Conn) -> Iterator[str]:
    with scratch_role(conn, "slawatch_qa") as name:
        yield name


def sweep(app: Conn, plan: ClaimPlan, now: datetime) -> int:
    """One drain that sweeps (as ``run --once`` does): alerts claimed."""
    assert plan.table is not None
    got, _ = drain_table(
        lambda: nullcontext(app),
        plan.table,
        plan.params,
        plan.to_deadline,
        FixedClock(now),
        DAY,
        sweep=True,
    )
    return got


def select_only(conn: Conn, rule: Rule, name: str, tables: str) -> None:
    """Exactly the GRANTs ``migrate --print`` prints: slawatch's own schema, and SELECT
    on the query's ``tables`` (nothing more)."""
    printed = [g.as_string(conn) for g in grants([rule], name)]
    for table in tables.split(", "):
        assert f'GRANT SELECT ON "{table}" TO "{name}"' in printed
    for g in printed:
        conn.execute(g)


def test_a_stalled_job_pages_its_action_runs_and_it_resolves(
    conn: Conn, role: tuple[str, str], action_role: str
) -> None:
    now = datetime.now(UTC)
    conn.execute(
        "CREATE TABLE workers (id bigint PRIMARY KEY, last_heartbeat timestamptz NOT NULL);"
        "CREATE TABLE jobs (id bigint PRIMARY KEY, task text NOT NULL, status text NOT NULL,"
        " worker_id bigint)"
    )
    conn.execute(
        "INSERT INTO workers VALUES (1, %s), (2, %s)",
        (now - timedelta(minutes=10), now - timedelta(seconds=30)),
    )
    # 1: its worker's heartbeat is 10 min old; 2: its worker is gone; 3: alive;
    # 4: old heartbeat but not doing.
    conn.execute(
        "INSERT INTO jobs VALUES (1, 'sync', 'doing', 1), (2, 'mail', 'doing', 9),"
        " (3, 'sync', 'doing', 2), (4, 'sync', 'todo', 1)"
    )
    rule = stalled_rule().model_copy(
        update={"action": stalled_rule().action.model_copy(update={"role": action_role})}  # type: ignore[union-attr]
    )
    migrate(conn, [rule])
    name, as_role = role
    select_only(conn, rule, name, "jobs, workers")
    with psycopg.connect(as_role, autocommit=True) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("UPDATE jobs SET status = 'failed'")  # watching only reads
        plan = prepare(app, rule).with_act(runner("on"))
        assert sweep(app, plan, now) == 2
        assert [a[:2] for a in alerts(conn, "job_stalled")] == [("1", 1), ("2", 1)]
        # The action bound :id from the query's output, as the actions' own role.
        assert conn.execute("SELECT id, status FROM jobs ORDER BY id").fetchall() == [
            (1, "failed"),
            (2, "failed"),
            (3, "doing"),
            (4, "todo"),
        ]
        assert resolved(conn, "job_stalled") == []
        sweep(app, plan, now + timedelta(seconds=1))
    assert [r[:2] for r in resolved(conn, "job_stalled")] == [("1", 1), ("2", 1)]
    # Nothing was built on the watched tables: only slawatch's state table.
    assert conn.execute(
        "SELECT count(*) FROM pg_indexes WHERE tablename IN ('jobs', 'workers')"
    ).fetchone() == (2,)


def test_a_paid_order_without_a_shipment_pages_and_resolves_when_shipped(
    conn: Conn, role: tuple[str, str]
) -> None:
    now = datetime.now(UTC)
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz);"
        "CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id bigint NOT NULL)"
    )
    conn.execute(
        "INSERT INTO orders VALUES (1, 'ada', 'paid', %s), (2, 'bob', 'paid', %s),"
        " (3, 'cy', 'paid', %s), (4, 'di', 'new', NULL)",
        (now - timedelta(hours=50), now - timedelta(hours=60), now - timedelta(hours=1)),
    )
    conn.execute("INSERT INTO shipments (order_id) VALUES (2)")
    rule = unshipped_rule()
    migrate(conn, [rule])
    name, as_role = role
    select_only(conn, rule, name, "orders, shipments")
    with psycopg.connect(as_role, autocommit=True) as app:
        plan = prepare(app, rule)
        assert sweep(app, plan, now) == 1
        got = alerts_of(conn, "order_unshipped", "key", "n", "row_data")
        assert got == [("1", 1, {"customer": "ada"})]
        conn.execute("INSERT INTO shipments (order_id) VALUES (1)")
        assert sweep(app, plan, now + timedelta(seconds=1)) == 0
    assert [r[:2] for r in resolved(conn)] == [("1", 1)]


def test_a_view_is_watched_through_a_query(conn: Conn) -> None:
    now = datetime.now(UTC)
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz);"
        "CREATE VIEW paid AS SELECT id, customer, paid_at FROM orders WHERE status = 'paid'"
    )
    conn.execute("INSERT INTO orders VALUES (1, 'ada', 'paid', %s)", (now - timedelta(days=3),))
    rule = unshipped_rule("SELECT * FROM paid WHERE customer LIKE 'a%'")  # a % as written
    migrate(conn, [rule])
    plan = prepare(conn, rule)
    assert sweep(conn, plan, now) == 1
    conn.execute("UPDATE orders SET status = 'shipped'")
    sweep(conn, plan, now + timedelta(seconds=1))
    assert [r[:2] for r in resolved(conn)] == [("1", 1)]
    # table: naming the view is refused, and says how to watch it.
    body = rule.model_dump(mode="json", exclude_unset=True, exclude={"table", "query"})
    _, errors = check_rule(conn, Rule.model_validate(body | {"table": "paid"}))
    assert errors == [
        "<config>: table: paid is not a table (a view or similar); watch it with"
        " track: table and query: SELECT * FROM paid"
    ]


def write(rules: Path, rule: Rule) -> None:
    rules.mkdir(exist_ok=True)
    body = rule.model_dump(
        mode="json", by_alias=True, exclude_unset=True, exclude={"name", "table"}
    )
    (rules / f"{rule.name}.yaml").write_text(yaml.safe_dump(body))


def test_check_names_a_column_the_query_does_not_return_and_explain_shows_its_plan(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz);"
        "CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id bigint NOT NULL)"
    )
    args = ["--dsn", dsn, "--rules", str(tmp_path / "rules")]
    args += ["--notifiers", str(ROOT / "notifiers")]
    write(tmp_path / "rules", unshipped_rule(UNSHIPPED.replace(", o.customer", "")))
    assert main([*args, "check"]) == 2
    got = capsys.readouterr()
    assert "columns: column 'customer' not in the query's output (id, paid_at)" in (
        got.out + got.err
    )
    write(tmp_path / "rules", unshipped_rule())
    assert main([*args, "migrate"]) == 0
    capsys.readouterr()
    assert main([*args, "check"]) == 0
    out = capsys.readouterr().out
    assert "  order_unshipped: 0 rows would be notified on the next scan\n" in out
    assert "order_unshipped: note:" not in out, out  # small tables: read whole, and rightly
    assert main([*args, "explain", "order_unshipped"]) == 0
    out = capsys.readouterr().out
    # The query's own plan, and its tables named as read whole (small now).
    assert "Seq Scan on orders o" in out, out
    assert "ok: the query reads public.orders, public.shipments whole, small now" in out, out
    # A large table read whole: check warns, explain fails.
    conn.execute(
        "INSERT INTO shipments (order_id) SELECT g FROM generate_series(1, 100000) g;"
        " ANALYZE shipments"
    )
    assert main([*args, "check"]) == 0
    out = capsys.readouterr().out
    assert "  order_unshipped: note: the query reads public.orders, public.shipments whole" in out
    assert main([*args, "explain", "order_unshipped"]) == 1


def test_run_once_pages_a_query_rule_as_a_select_only_role(
    conn: Conn, role: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz);"
        "CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id bigint NOT NULL)"
    )
    conn.execute("INSERT INTO orders VALUES (1, 'ada', 'paid', now() - interval '3 days')")
    rule = unshipped_rule()
    write(tmp_path / "rules", rule)
    migrate(conn, [rule])
    name, as_role = role
    select_only(conn, rule, name, "orders, shipments")
    args = ["--dsn", as_role, "--rules", str(tmp_path / "rules")]
    args += ["--notifiers", str(ROOT / "notifiers")]
    assert main([*args, "run", "--once"]) == 0
    assert [a[:2] for a in alerts(conn, "order_unshipped")] == [("1", 1)]
    capsys.readouterr()
    assert main([*args, "status"]) == 0
    assert "order_unshipped" in capsys.readouterr().out
    assert main([*args, "report"]) == 0
    assert "a query rule's deadlines are not indexed" in capsys.readouterr().out
    conn.execute("INSERT INTO shipments (order_id) VALUES (1)")
    assert main([*args, "run", "--once"]) == 0
    assert [r[:2] for r in resolved(conn)] == [("1", 1)]


def test_a_key_the_query_returns_twice_is_watched_once_and_each_sweep_names_it(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz);"
        "CREATE TABLE items (order_id bigint NOT NULL, sku text NOT NULL)"
    )
    conn.execute(
        "INSERT INTO orders VALUES (1, 'ada', 'paid', %s), (2, 'bob', 'paid', %s),"
        " (3, 'cy', 'paid', %s)",
        (now - timedelta(hours=50), now - timedelta(hours=60), now - timedelta(hours=1)),
    )
    # A join that fans out: order 1 has two items, so the output holds key 1 twice
    # (and 3, not due yet, twice too: not named).
    conn.execute("INSERT INTO items VALUES (1, 'a'), (1, 'b'), (2, 'c'), (3, 'd'), (3, 'e')")
    rule = unshipped_rule(
        "SELECT o.id, o.paid_at, o.customer FROM orders o JOIN items i ON i.order_id = o.id"
    )
    migrate(conn, [rule])
    plan = prepare(conn, rule)
    with caplog.at_level("WARNING", logger="slawatch.engine.statetable"):
        assert sweep(conn, plan, now) == 2
        assert sweep(conn, plan, now + DAY) == 0  # each key once; no renotify
    assert [a[:2] for a in alerts(conn, "order_unshipped")] == [("1", 1), ("2", 1)]
    warned = [r.getMessage() for r in caplog.records]
    assert warned == 2 * [
        "rule order_unshipped: key 1 is in the query's output 2 times: it is watched as"
        " the row with the earliest deadline; make the query return one row per key"
        " (docs/reference/rules.md)"
    ]
    # Paid again (a new deadline, not due): the episode ends, and its resolved notice
    # reads one of the key's two rows.
    conn.execute("UPDATE orders SET paid_at = %s WHERE id = 1", (now + DAY,))
    sweep(conn, plan, now + 2 * DAY)
    assert [r[:2] for r in resolved(conn)] == [("1", 1)]


def test_a_query_calling_a_volatile_function_of_the_database_is_refused(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a VOLATILE function may write: one the query calls would write at every
    sweep. A STABLE one (it can only read), and random(), are taken."""
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz);"
        "CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id bigint NOT NULL);"
        "CREATE TABLE log (at timestamptz);"
        "CREATE FUNCTION noted() RETURNS int LANGUAGE sql VOLATILE"
        " AS 'INSERT INTO log VALUES (now()) RETURNING 1';"
        "CREATE FUNCTION looked() RETURNS int LANGUAGE sql STABLE AS 'SELECT 1';"
        "INSERT INTO orders VALUES (1, 'a', 'paid', now() - interval '3 days')"
    )
    args = ["--dsn", dsn, "--rules", str(tmp_path / "rules")]
    args += ["--notifiers", str(ROOT / "notifiers")]
    writing = UNSHIPPED + " AND noted() = 1 AND random() < 2"
    rule = unshipped_rule(writing)
    _, errors = check_rule(conn, rule)
    assert errors == [
        f"{rule.source}: query: calls noted(), a VOLATILE function of the database's: a query"
        " rule only reads, at every sweep (a function that only reads can be declared STABLE)"
    ]
    write(tmp_path / "rules", rule)
    assert main([*args, "migrate"]) == 2
    assert main([*args, "check"]) == 2
    assert "calls noted(), a VOLATILE function" in capsys.readouterr().err
    assert conn.execute("SELECT count(*) FROM log").fetchone() == (0,)
    # Through views, at any depth: a view's SELECT runs its calls as the query's would.
    conn.execute(
        "CREATE VIEW noting AS SELECT id FROM orders WHERE noted() = 1;"
        "CREATE VIEW noting_too AS SELECT id FROM noting"
    )
    rule = unshipped_rule(UNSHIPPED + " AND o.id IN (SELECT id FROM noting_too)")
    assert [e.split(": ", 1)[1][:36] for e in check_rule(conn, rule)[1]] == [
        "query: calls noted(), a VOLATILE fun"
    ]
    write(tmp_path / "rules", unshipped_rule(UNSHIPPED + " AND looked() = 1 AND random() < 2"))
    assert main([*args, "migrate"]) == 0
    assert main([*args, "check"]) == 0


@pytest.mark.empty_database
def test_check_refuses_what_the_server_resolves_past_the_applications_rows(
    conn: Conn, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What no reading of the text can place, the server's analysis of the query does:
    a VOLATILE function of PostgreSQL's own that load did not name (only random(),
    clock_timestamp(), timeofday() and gen_random_uuid() are taken), and a table or
    function of slawatch's own schema found through the search path (a role named
    slawatch finds its own schema first: ``"$user", public``)."""
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz);"
        "CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id bigint NOT NULL);"
        "CREATE SCHEMA slawatch; CREATE TABLE slawatch.alert (id bigint, row_data jsonb);"
        "CREATE FUNCTION slawatch.gate() RETURNS boolean LANGUAGE sql STABLE AS 'SELECT true';"
        "SET search_path = slawatch, public"
    )
    rule = unshipped_rule(UNSHIPPED + " AND current_query() IS NOT NULL")
    assert check_rule(conn, rule)[1] == [
        f"{rule.source}: query: calls current_query(), a VOLATILE function of"
        " PostgreSQL's: a query rule only reads, at every sweep (a function that only reads"
        " can be declared STABLE)"
    ]
    rule = unshipped_rule(UNSHIPPED + " AND o.id IN (SELECT id FROM alert)")
    assert check_rule(conn, rule)[1] == [
        f"{rule.source}: query: reads slawatch.alert, slawatch's own table: a query rule"
        " reads the application's tables"
    ]
    rule = unshipped_rule(UNSHIPPED + " AND gate()")
    assert check_rule(conn, rule)[1] == [
        f"{rule.source}: query: calls slawatch.gate(), slawatch's own function: a query rule"
        " reads the application's tables"
    ]
    taken = " AND random() < 2 AND clock_timestamp() > o.paid_at AND gen_random_uuid() IS NOT NULL"
    assert check_rule(conn, unshipped_rule(UNSHIPPED + taken))[1] == []


def test_a_table_in_a_catalog_is_refused_before_check_counts_it(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``table: pg_catalog.pg_authid``: refused as rules load, so neither ``check`` (which
    would count its rows) nor ``migrate --print`` (which would print its ALTER TABLE)
    gets to it."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "authid.yaml").write_text(
        "table: pg_catalog.pg_authid\nkey: oid\ndeadline: rolvaliduntil\n"
        'open_when: "rolcanlogin"\ntrack: inline\nnotify: [console]\n'
    )
    args = ["--dsn", dsn, "--rules", str(rules), "--notifiers", str(ROOT / "notifiers")]
    for command in (["check"], ["migrate", "--print"]):
        assert main([*args, *command]) == 2
        out, err = capsys.readouterr()
        assert "ALTER" not in out and "pg_authid" not in out
        assert err.splitlines() == [
            f"slawatch: error: {rules / 'authid.yaml'}: table: 'pg_catalog.pg_authid' is a"
            " system catalog: a rule watches the application's tables"
        ]


def test_a_query_a_view_cannot_hold_is_one_line_of_check(conn: Conn) -> None:
    """The functions a query calls are read from a temporary view of it, which refuses
    an output naming a column twice: that is the rule's error line, not an exception
    that would stop check and migrate for every rule."""
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL,"
        " status text NOT NULL, paid_at timestamptz)"
    )
    rule = unshipped_rule("SELECT o.id, o.paid_at, o.customer, o.id AS id FROM orders o")
    _, errors = check_rule(conn, rule)
    assert errors == [f'{rule.source}: query: column "id" specified more than once']
