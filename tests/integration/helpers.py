"""Helpers for integration tests: the demo shop, claiming, reading alerts."""

from __future__ import annotations

import fcntl
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from slawatch.actions.run import runner
from slawatch.clock import Clock
from slawatch.config.rules import Rule, load_rules
from slawatch.demo import SHOP
from slawatch.engine.claim import ClaimPlan, claim_batch
from slawatch.engine.migrate import migrate
from slawatch.engine.ready import prepare
from slawatch.engine.statetable import drain_table
from tests.conftest import ROOT

Conn = psycopg.Connection[Any]
DAY = timedelta(days=1)


# The demo's shop (slawatch/sql/shop.sql) without its first statement, which drops
# slawatch's schema to reset the demo. A test's database is new and has the schema
# already (tests/conftest.py): dropping it made every shop() apply each migration again,
# most of a short test's set-up.
_DROP_SCHEMA = "DROP SCHEMA IF EXISTS slawatch CASCADE;\n"
assert SHOP.count(_DROP_SCHEMA) == 1
SHOP_TABLES = SHOP.replace(_DROP_SCHEMA, "")


def shop(conn: Conn, track: str = "inline") -> dict[str, Rule]:
    """The demo shop's tables, migrated for the shipped example rules tracked ``track``
    (the tables dropped and made again if they exist; slawatch's schema kept)."""
    conn.execute(SHOP_TABLES)
    # An event rule watches its own timer table, always inline.
    rules = [
        r.model_copy(update={"track": track}) if r.events is None else r
        for r in load_rules(ROOT / "rules")
    ]
    migrate(conn, rules)
    return {r.name: r for r in rules}


class FixedClock(Clock):
    """A clock that stays at one time."""

    def __init__(self, now: datetime) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now


def plans(conn: Conn, rules: dict[str, Rule]) -> dict[str, ClaimPlan]:
    """Each rule's claim plan. A shipped rule's action (job_hung restarts its job) is
    recorded ``would_run`` and not run (SLAWATCH_ACTIONS=off), so the watched rows stay
    as the test sets them; tests of the actions themselves run them
    (test_action_examples.py)."""
    return {name: prepare(conn, rule).with_act(runner("off")) for name, rule in rules.items()}


def claim_all(conn: Conn, plan: ClaimPlan, now: datetime | None = None) -> int:
    """Claim until a batch comes back short, at the application clock's now."""
    if plan.table is not None:  # track: table: a whole drain (watermark, sweep, batches)
        clock = FixedClock(now or Clock().now())
        alerts, _ = drain_table(
            lambda: nullcontext(conn), plan.table, plan.params, plan.to_deadline, clock, DAY
        )
        return alerts
    total = 0
    while True:
        got = claim_batch(conn, plan, now or Clock().now())
        total += got
        if got < plan.rule.batch:
            return total


# The alerts of a rule in either shape of the outbox (docs/explanation/outbox-rows.md):
# the elements of its rows, and its alerts in slawatch.alert. A rule whose action is a
# webhook keeps, beside its rows, the alerts the action is on in slawatch.alert (with
# only the action's delivery): those are the rows' alerts again, and are left out.
Column = Literal[
    "rule", "kind", "key", "episode", "n", "severity", "deadline", "due_at", "fired_at",
    "row_data", "notifiers",
]  # fmt: skip
# Each column's value in a row's element (r, u) and in an alert of slawatch.alert (a).
# Element i is due at due_ats[i], or at deadlines[i] + after; an alert's notifiers are
# those of its deliveries, a row's those it is sent to, sorted alike.
_COLUMNS: dict[str, tuple[str, str]] = {
    "rule": ("r.rule", "a.rule"),
    "kind": ("r.kind", "a.kind"),
    "key": ("u.key", "a.key"),
    "episode": ("u.episode", "a.episode"),
    "n": ("u.n", "a.n"),
    "severity": ("u.severity", "a.severity"),
    "deadline": ("u.deadline", "a.deadline"),
    "due_at": ("coalesce(u.due_at, u.deadline + r.after)", "a.due_at"),
    "fired_at": ("r.fired_at", "a.fired_at"),
    "row_data": ("u.row_data", "a.row_data"),
    "notifiers": (
        "ARRAY(SELECT x FROM unnest(r.notifiers) x ORDER BY 1)",
        "ARRAY(SELECT d.notifier FROM slawatch.delivery d WHERE d.alert_id = a.id ORDER BY 1)",
    ),
}


def alerts_of(
    conn: Conn, rule: str | None, *columns: Column, kind: str | None = None
) -> list[tuple[Any, ...]]:
    """``columns`` of every alert of ``rule`` (of every rule if None), of ``kind`` if
    given, whichever shape of the outbox holds it; sorted by the columns in the order
    asked for, then by rule, key, episode and n."""
    assert columns and len(set(columns)) == len(columns) and set(columns) <= _COLUMNS.keys()

    def chosen(shape: int) -> str:
        return ", ".join(f"{_COLUMNS[c][shape]} AS {c}" for c in columns)

    def of(t: str) -> str:  # the rule's and the kind's, of the table aliased t
        return "".join(
            f" AND {t}.{name} = %({name})s"
            for name, value in (("rule", rule), ("kind", kind))
            if value is not None
        )

    rows = conn.execute(
        "WITH el AS ("
        f" SELECT r.rule AS _rule, u.key AS _key, u.episode AS _episode, u.n AS _n, {chosen(0)}"
        "   FROM slawatch.outbox_row r,"
        "        unnest(r.keys, r.episodes, r.ns, r.severities, r.deadlines, r.due_ats,"
        "               r.row_data) AS u(key, episode, n, severity, deadline, due_at, row_data)"
        f"  WHERE true{of('r')})"
        f" SELECT {', '.join(columns)} FROM ("
        "  SELECT * FROM el"
        "  UNION ALL"
        f" SELECT a.rule, a.key, a.episode, a.n, {chosen(1)} FROM slawatch.alert a"
        f"  WHERE true{of('a')}"
        "    AND NOT EXISTS (SELECT 1 FROM el WHERE el._rule = a.rule AND el._key = a.key"
        "                    AND el._episode = a.episode AND el._n = a.n)) x"
        f" ORDER BY {', '.join(str(i) for i in range(1, len(columns) + 1))},"
        "  _rule, _key, _episode, _n",
        {"rule": rule, "kind": kind},
    ).fetchall()
    return [tuple(row) for row in rows]


def alerts(conn: Conn, rule: str) -> list[tuple[str, int, str, list[str]]]:
    """(key, n, severity, [notifiers]) of every alert of ``rule``, in order, whichever
    shape of the outbox holds it."""
    got = alerts_of(conn, rule, "key", "n", "severity", "notifiers")
    return [(k, n, s, sorted(ns)) for k, n, s, ns in got]


def episodes(conn: Conn, rule: str) -> list[tuple[str, int, int]]:
    """(key, episode, n) of every alert of ``rule``, in order, whichever shape of the
    outbox holds it."""
    return [(k, e, n) for k, e, n in alerts_of(conn, rule, "key", "episode", "n")]


def tracking(conn: Conn, rule: str, table: str, key: int) -> tuple[Any, ...]:
    """(n, next, seen, ep) of one row of ``table``."""
    from psycopg import sql

    row = conn.execute(
        sql.SQL("SELECT {}, {}, {}, {} FROM {} WHERE id = %s").format(
            *(sql.Identifier(f"sw_{rule}_{c}") for c in ("n", "next", "seen", "ep")),
            sql.Identifier(table),
        ),
        (key,),
    ).fetchone()
    assert row is not None
    return tuple(row)


# slawatch.alert and slawatch.delivery as 0013_scan_heartbeat.sql left them: plain tables
# (0001_initial.sql, with 0002_trust.sql's delivery_orphaned and status check and 0005's
# trigger), not 0015_rotate.sql's id ranges (0016_rotate_retry.sql's versions of its
# functions go with them; it dropped history_lo and history_hi).
UNROTATED = """
DROP TABLE slawatch.alert, slawatch.delivery, slawatch.history_range,
           slawatch.history_convert;
DROP FUNCTION slawatch.history_open(integer, bigint, bigint, timestamptz),
              slawatch.history_rotate(timestamptz, interval),
              slawatch.history_drop(timestamptz),
              slawatch.history_convert_all(timestamptz),
              slawatch.history_mirror_alert(), slawatch.history_mirror_delivery();
-- 0026_outbox_rows_ranges.sql (its history_convert_all went above).
DROP FUNCTION slawatch.history_convert_alerts(timestamptz),
              slawatch.history_open_rows(integer, bigint, bigint), slawatch.history_rows_open();
CREATE TABLE slawatch.alert (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule        text        NOT NULL,
    key         text        NOT NULL,
    episode     integer     NOT NULL,
    n           integer     NOT NULL,
    severity    text        NOT NULL,
    deadline    timestamptz,
    due_at      timestamptz,
    fired_at    timestamptz NOT NULL,
    row_data    jsonb       NOT NULL,
    kind        text        NOT NULL DEFAULT 'firing'
                            CONSTRAINT alert_kind
                            CHECK (kind IN ('firing', 'resolved', 'summary')),
    CONSTRAINT alert_once UNIQUE (rule, key, episode, n)
);
CREATE INDEX alert_rule_fired ON slawatch.alert (rule, fired_at);
CREATE TABLE slawatch.delivery (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert_id         bigint      NOT NULL,
    notifier         text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                                 CONSTRAINT delivery_status
                                 CHECK (status IN ('pending', 'sent', 'dead', 'silenced',
                                                   'summarized', 'acknowledged', 'orphaned')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    last_error       text,
    sent_at          timestamptz,
    summary_id       bigint,
    CONSTRAINT delivery_once UNIQUE (alert_id, notifier)
);
CREATE INDEX delivery_summary ON slawatch.delivery (summary_id, alert_id)
    WHERE summary_id IS NOT NULL;
CREATE INDEX delivery_due ON slawatch.delivery (notifier, next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX delivery_dead ON slawatch.delivery (alert_id) WHERE status = 'dead';
CREATE INDEX delivery_orphaned ON slawatch.delivery (notifier, alert_id)
    WHERE status = 'orphaned';
CREATE TRIGGER action_settled
    AFTER UPDATE OF status ON slawatch.delivery
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.notifier LIKE 'action:%')
    EXECUTE FUNCTION slawatch.action_delivery_settled();
-- The later migrations run again: what they make goes too (0017_deliveries_due.sql).
DROP FUNCTION slawatch.deliveries_due(text, timestamptz);
DROP FUNCTION slawatch.deliveries_due_by_shape(text, timestamptz);  -- 0024_...by_shape.sql
DROP FUNCTION slawatch.lease_row_send(text, timestamptz, uuid, interval, bigint, uuid, integer,
                                     text[]);  -- 0025_lease_row_send.sql
DROP TABLE slawatch.outbox_row, slawatch.outbox_send;  -- 0020_outbox_rows.sql
ALTER TABLE slawatch.episode DROP COLUMN resolved_notice_at;  -- 0023_outbox_rows_calendar.sql
DELETE FROM slawatch.schema_version WHERE version >= 14;
"""


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A JSON plan's nodes, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def batch_with_nested_loops(
    conn: Conn, statement: sql.Composable, params: dict[str, Any]
) -> tuple[dict[str, int], list[tuple[str | None, int]]]:
    """EXPLAIN ANALYZE of a claim batch (rolled back) with nested loops for every join,
    the plan statistics from before a backlog give: the rows each CTE wrote, by name,
    and the joins that removed at least 2,000 rows by their join filter (a nested loop
    comparing each row of one CTE with every row of another)."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_hashjoin = off")
        conn.execute("SET LOCAL enable_mergejoin = off")
        (doc,) = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + statement, params
        ).fetchone()  # type: ignore[misc]
        raise psycopg.Rollback()  # EXPLAIN ANALYZE wrote the batch: undone
    nodes = list(plan_nodes(doc[0]["Plan"]))
    wrote = {str(n["Subplan Name"]): n["Actual Rows"] for n in nodes if n.get("Subplan Name")}
    quadratic = [
        (n.get("Join Filter"), n["Rows Removed by Join Filter"])
        for n in nodes
        if n.get("Rows Removed by Join Filter", 0) >= 2000
    ]
    return wrote, quadratic


def by_parent(conn: Conn, plan: dict[str, Any]) -> dict[str, Any]:
    """An EXPLAIN (FORMAT JSON) plan with the outbox's partitions (0015_rotate.sql's id
    ranges) and their indexes named by their partitioned parents, in place."""
    parent = dict(
        conn.execute(
            "SELECT c.relname, p.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent"
            " WHERE p.relnamespace = 'slawatch'::regnamespace"
        ).fetchall()
    )

    def rename(node: dict[str, Any]) -> None:
        for field in ("Relation Name", "Index Name"):
            if node.get(field) in parent:
                node[field] = parent[node[field]]
        for child in node.get("Plans", []):
            rename(child)

    rename(plan)
    return plan


def partitions(conn: Conn, table: str) -> list[str]:
    """The partitions of slawatch.``table`` (its id ranges), qualified."""
    return [
        f"slawatch.{r[0]}"
        for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            (f"slawatch.{table}",),
        ).fetchall()
    ]


def unrotated(conn: Conn) -> None:
    """Put the outbox back as 0013_scan_heartbeat.sql left it (empty, plain tables; 0015's
    record, functions and version gone): the schema an upgrade starts from."""
    conn.execute(UNROTATED)


def unversioned(conn: Conn) -> None:
    """Forget the applied migrations: the database then looks like one made before
    versioned migrations (those releases had no slawatch.schema_version), so a test
    that reshapes slawatch's tables into an older release's sees the next migrate
    take that path (schema.py: the legacy upgrade). What the later migrations
    (0002_trust.sql on) added goes too: the previous release had none of it."""
    unrotated(conn)  # 0015_rotate.sql's id ranges
    conn.execute(
        "DROP TABLE slawatch.schema_version;"
        " DROP TABLE IF EXISTS slawatch.session, slawatch.event_seen, slawatch.action,"
        " slawatch.episode, slawatch.event_held, slawatch.scanner;"
        " DROP INDEX IF EXISTS slawatch.delivery_orphaned, slawatch.ack_acked_at;"
        # 0005_action_webhook.sql's trigger on the outbox and its function.
        " DROP TRIGGER IF EXISTS action_settled ON slawatch.delivery;"
        " DROP FUNCTION IF EXISTS slawatch.action_delivery_settled();"
        # 0009_generation.sql's record of the rules' definitions and its functions.
        " DROP TABLE IF EXISTS slawatch.rule_generation;"
        " DROP FUNCTION IF EXISTS slawatch.claim_gate(text, text),"
        " slawatch.record_generation(text, text, jsonb);"
        # 0014_delivery_lease.sql's room for leases on the outbox's pages.
        " ALTER TABLE slawatch.delivery RESET (fillfactor)"
    )


@contextmanager
def role_slawatch_app(conn: Conn) -> Iterator[str]:
    """The role ``slawatch_app``, which the printed scripts grant to: created, and dropped
    after (with what it holds in ``conn``'s database). A role belongs to the whole
    server, so one test at a time on this machine holds it: a file lock (the tests that
    use it share an xdist group too; CI once found it taken all the same)."""
    path = Path(tempfile.gettempdir()) / "slawatch-test-role-slawatch_app.lock"
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn.execute("CREATE ROLE slawatch_app")
        try:
            yield "slawatch_app"
        finally:
            conn.execute("DROP OWNED BY slawatch_app")
            conn.execute("DROP ROLE slawatch_app")


@contextmanager
def scratch_role(conn: Conn, prefix: str, options: str = "") -> Iterator[str]:
    """A role of the test's own (``CREATE ROLE <prefix>_<random> <options>``), holding
    nothing yet; what it was granted and the role go at the end."""
    name = f"{prefix}_{uuid.uuid4().hex[:6]}"
    conn.execute(f"CREATE ROLE {name} {options}")
    try:
        yield name
    finally:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


def dsn_as(dsn: str, user: str) -> str:
    """``dsn`` connecting as ``user`` (a role without a password: trust auth)."""
    params = conninfo_to_dict(dsn) | {"user": user}
    params.pop("password", None)
    return make_conninfo("", **params)


def history(
    conn: Conn, fired_at: datetime, *statuses: str, rule: str = "late", notifier: str = "notifier"
) -> int:
    """An alert fired at ``fired_at`` with one delivery per status given (to
    ``notifier`` 0, 1, ...); its id."""
    row = conn.execute(
        "INSERT INTO slawatch.alert (rule, key, episode, n, severity, fired_at, row_data)"
        " VALUES (%s, %s, 1, 1, 'warning', %s, '{}') RETURNING id",
        (rule, uuid.uuid4().hex, fired_at),
    ).fetchone()
    assert row is not None
    for i, status in enumerate(statuses):
        conn.execute(
            "INSERT INTO slawatch.delivery (alert_id, notifier, status, next_attempt_at)"
            " VALUES (%s, %s, %s, %s)",
            (row[0], f"{notifier}{i}", status, fired_at),
        )
    return int(row[0])
