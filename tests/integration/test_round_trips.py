"""A claim batch is one statement and one round trip: it commits on its own, with
the NOTIFY that wakes the delivery workers inside it (issue 7: the empty probe
paid for BEGIN and COMMIT besides the statement)."""

from __future__ import annotations

import tempfile
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from slawatch.config.settings import Outbox
from slawatch.db import Pooler
from slawatch.engine.claim import batches, claim_batch
from slawatch.engine.ready import prepare
from tests.integration.helpers import Conn, alerts, shop

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def round_trips(conn: Conn, work: object, *, empty: bool = False) -> int:
    """Messages that end a request to the server (a simple Query, or the Sync after
    Parse/Bind/Execute), read from libpq's own protocol trace of ``work()``; an empty
    query (psycopg_pool's liveness check) only with ``empty``."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        try:
            work()  # type: ignore[operator]
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        sent = [line.split("\t") for line in trace.read().splitlines()]
    return sum(
        1
        for f in sent
        if len(f) > 3
        and f[1] == "F"
        and (f[3] == "Sync" or (f[3] == "Query" and (empty or f[-1].strip() != '""')))
    )


def alerted(conn: Conn, orders: int) -> None:
    """The shop with ``orders`` paid orders overdue, claimed by ``order_unshipped`` into
    today's outbox (the delivery claim's round trips below are its own): one pending
    delivery each, for the console."""
    rules = shop(conn)
    conn.execute(
        "INSERT INTO orders (id, user_id, total_cents, status, paid_at)"
        " SELECT g, 7, 100, 'paid', %s FROM generate_series(1, %s) g",
        (datetime(2026, 2, 1, tzinfo=UTC), orders),
    )
    step = batches(conn, prepare(conn, rules["order_unshipped"], outbox="alerts"), NOW)
    assert step() == orders


@pytest.mark.parametrize("outbox", ["alerts", "rows"])
@pytest.mark.parametrize("track", ["inline", "table"])
def test_a_claim_batch_is_one_round_trip(conn: Conn, track: str, outbox: Outbox) -> None:
    rules = shop(conn, track)
    rule = rules["order_unshipped"]
    conn.execute(
        "INSERT INTO orders (id, user_id, total_cents, status, paid_at)"
        " VALUES (1, 7, 100, 'paid', %s)",
        (datetime(2026, 2, 1, tzinfo=UTC),),
    )
    plan = prepare(conn, rule, outbox=outbox)
    assert conn.autocommit
    if track == "table":  # a short batch also records the watermark: one more
        step = batches(conn, plan, NOW)  # the table's watermark and sweep are read here
        assert round_trips(conn, step) == 2
    else:  # (a drain probes first: test_idle.py)
        assert round_trips(conn, lambda: claim_batch(conn, plan, NOW)) == 1
    assert len(alerts(conn, "order_unshipped")) == 1


@pytest.mark.parametrize("pooler", ["transaction", "none"])
def test_a_delivery_claim_without_storm_is_one_statement(
    conn: Conn, dsn: str, pooler: Pooler
) -> None:
    """The delivery loop's claim (leases, and the settling of the batch just sent) is one
    statement and one round trip: in its own transaction where nothing is prepared
    (behind a transaction pooler); where it is prepared, the setting that runs it on its
    generic plan and the claim are pipelined with one Sync (one implicit transaction:
    no BEGIN, no COMMIT), planned once per connection, and prepared in the same request
    the first time. Taking the connection from the pool costs none (no liveness query:
    it was used a moment ago)."""
    from slawatch.config.notifiers import ConsoleConfig
    from slawatch.db import Database
    from slawatch.delivery.dispatcher import claim_deliveries
    from slawatch.delivery.notifiers import build

    alerted(conn, 1)
    notifier = build(ConsoleConfig(name="console", type="console"))
    # Every plan priced for JIT: the claim's generic plan is planned without it (its
    # estimate grows with a backlog past the threshold, and a cached plan is compiled
    # again at each run).
    (database,) = conn.execute("SELECT current_database()").fetchone()  # type: ignore[misc]
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET jit_above_cost = 0").format(sql.Identifier(database))
    )
    db = Database(dsn, size=1, timeout=10, pooler=pooler)
    try:
        with db.connection("tracing") as pooled:
            traced = pooled  # the pool's one connection: the one claim_deliveries will get
        # The first claim on a connection also prepares the statement where the pooler
        # allows: in the same request.
        first = round_trips(traced, lambda: claim_deliveries(db, notifier, NOW), empty=True)
        count = round_trips(traced, lambda: claim_deliveries(db, notifier, NOW), empty=True)
        plans = traced.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE 'WITH sent AS%'"
        ).fetchall()
        jit = compiled(traced) if pooler == "none" else None
    finally:
        db.close()
    if pooler == "transaction":
        assert (first, count, plans) == (1, 1, [])
    else:
        assert (first, count) == (1, 1)
        assert plans == [(2, 0)]  # both claims on the generic plan, none planned again
        # The cached generic plan was made without JIT: run again on it (the session's
        # jit on), it compiles nothing.
        available = conn.execute("SELECT pg_jit_available()").fetchone() == (True,)
        assert jit == (False if available else None)


@pytest.mark.parametrize("pooler", ["transaction", "none"])
def test_the_batch_sent_is_settled_by_the_next_claim_alone(
    conn: Conn, dsn: str, pooler: Pooler
) -> None:
    """The claim that follows an accepted batch settles it as sent and says which of its
    deliveries it settled (their ids, in one row): the worker then has nothing left to
    mark, so settling costs no round trip of its own (mark_sent runs only for what
    another claim held locked)."""
    from slawatch.config.notifiers import ConsoleConfig
    from slawatch.db import Database
    from slawatch.delivery.dispatcher import claim_deliveries
    from slawatch.delivery.notifiers import build

    alerted(conn, 3)
    notifier = build(ConsoleConfig(name="console", type="console", batch=2))
    db = Database(dsn, size=1, timeout=10, pooler=pooler)
    try:
        with db.connection("tracing") as pooled:
            traced = pooled
        first = claim_deliveries(db, notifier, NOW)
        assert len(first.rows) == 2
        following: list[object] = []
        count = round_trips(
            traced,
            lambda: following.append(claim_deliveries(db, notifier, NOW, sent=first)),
            empty=True,
        )
    finally:
        db.close()
    assert count == 1
    assert conn.execute(
        "SELECT status, count(*) FROM slawatch.delivery GROUP BY 1 ORDER BY 1"
    ).fetchall() == [("pending", 1), ("sent", 2)]


def compiled(conn: Conn) -> bool | None:
    """Whether the delivery claim's cached generic plan on ``conn`` compiles with JIT
    when it runs (EXPLAIN ANALYZE of it, rolled back); None where the server has no JIT."""
    from slawatch.delivery.dispatcher import CLAIM

    if conn.execute("SELECT pg_jit_available()").fetchone() != (True,):
        return None
    (name,) = conn.execute(  # type: ignore[misc]
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'WITH sent AS%'"
    ).fetchone()
    values = CLAIM.args(
        {
            "now": NOW,
            "owner": uuid.uuid4(),
            "lease": "60 seconds",
            "limit": 100,
            "notifier": "console",
            "sent_alerts": "{}",
            "sent_owner": None,
        }
    )
    with conn.transaction():
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")  # the cached plan
        (doc,) = conn.execute(  # type: ignore[misc]
            sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {}({})").format(
                sql.Identifier(name), sql.SQL(", ").join(map(sql.Literal, values))
            )
        ).fetchone()
        raise psycopg.Rollback()
    return "JIT" in doc[0]
