"""Rule ``give_up_after`` (docs/reference/rules.md, docs/how-to/operate.md): an episode still
open that long after its due time is ended as abandoned, so neither the open
timers of an event rule nor the open episodes and re-notifications of a row that
stays overdue grow for ever. Walked with the clock passed in (FixedClock), against
a real PostgreSQL; the maintenance job (Runner.maintain) gives up and counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from psycopg import sql

from slawatch.config.notifiers import ConsoleConfig
from slawatch.config.rules import Renotify, Rule
from slawatch.db import Database
from slawatch.engine.abandon import give_up, give_up_statement
from slawatch.engine.ready import prepare
from slawatch.engine.statetable import state_table
from slawatch.operate.inspect import open_timers_statement, rule_status
from slawatch.runtime.maintain import prune_events
from slawatch.runtime.scheduler import Runner
from tests.integration.helpers import Conn, FixedClock, claim_all, episodes, shop
from tests.integration.test_deliver import T0
from tests.integration.test_events import parcel, scan, send, setup, timer

H = timedelta(hours=1)
D = timedelta(days=1)
S = timedelta(seconds=1)
M = timedelta(minutes=1)


@pytest.fixture
def db(dsn: str) -> Iterator[Database]:
    with Database(dsn, size=2, pooler="none") as database:
        yield database


def history(conn: Conn, rule: str) -> list[tuple[str, int, bool, bool]]:
    """(key, episode, ended, abandoned) of each episode of ``rule``."""
    rows = conn.execute(
        "SELECT key, episode, ended_at IS NOT NULL, abandoned FROM slawatch.episode"
        " WHERE rule = %s ORDER BY key, episode",
        (rule,),
    ).fetchall()
    return [(k, e, bool(x), bool(a)) for k, e, x, a in rows]


def given_up(conn: Conn, rule: Rule) -> bool | None:
    """Whether order 1's next notification is the given-up mark (``infinity``); None
    when it has none."""
    if rule.track == "table":
        query = sql.SQL("SELECT sw_next = 'infinity' FROM {}").format(state_table(rule))
    else:
        query = sql.SQL("SELECT {} = 'infinity' FROM orders WHERE id = 1").format(
            sql.Identifier(rule.next_column)
        )
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def metric(registry: CollectorRegistry, rule: str) -> float | None:
    return registry.get_sample_value("slawatch_abandoned_total", {"rule": rule})


@pytest.mark.parametrize("renotify", [{"every": "6h"}, None], ids=["renotify", "once"])
def test_a_row_that_stays_overdue_is_given_up_and_stops_renotifying(
    conn: Conn, db: Database, track: str, renotify: dict[str, str] | None
) -> None:
    """Renotify every 6 h without a max (or notify once), give up after 3 days:
    re-notified until the episode is 3 days past due, then ended as abandoned (history,
    status) and never re-notified again; not a new episode while it stays overdue."""
    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={
            "renotify": None if renotify is None else Renotify.model_validate(renotify),
            "escalate": [],
            "give_up_after": 3 * D,
        }
    )
    plan = prepare(conn, rule)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', %s)", (T0,))
    due = T0 + rule.after
    assert claim_all(conn, plan, due + S) == 1
    assert give_up(db, [plan], due + 3 * D - S) == {}  # not yet
    assert given_up(conn, rule) is not True
    assert give_up(db, [plan], due + 3 * D + S) == {"order_unshipped": 1}
    assert give_up(db, [plan], due + 3 * D + 2 * S) == {}  # once
    assert history(conn, "order_unshipped") == [("1", 1, True, True)]
    assert given_up(conn, rule) is True
    sent = len(episodes(conn, "order_unshipped"))
    for day in range(4, 30, 5):
        assert claim_all(conn, plan, due + day * D) == 0
    assert len(episodes(conn, "order_unshipped")) == sent
    (status,) = rule_status(conn, [rule], due + 30 * D)
    assert status.abandoned == 1
    # Not an episode awaiting a re-notification any more; still overdue.
    assert status.notified == (None if renotify is None else 0) and status.overdue == 1


def test_a_start_without_its_stop_is_closed_and_then_pruned(
    conn: Conn, db: Database, dsn: str
) -> None:
    """An event rule: the start pages, its stop never comes; after give_up_after past
    the deadline the timer is closed (no longer open, no resolved notice), and
    retention prunes it like any closed timer. Through Runner.maintain: counted in
    slawatch_abandoned_total."""
    rule = parcel(within="72h").model_copy(
        update={"renotify": Renotify.model_validate({"every": "12h"}), "give_up_after": 7 * D}
    )
    setup(conn, rule)
    send(conn, "parcel_shipped", "lost", T0)
    send(conn, "parcel_shipped", "fine", T0 + 5 * D)
    assert scan(db, rule, T0 + 72 * H + S) == 1
    count = open_timers_statement(rule)
    assert conn.execute(count).fetchone() == (2,)
    at = T0 + 72 * H + 7 * D + M
    runner = Runner(dsn, [rule], [ConsoleConfig(name="hook", type="console")], FixedClock(at))
    try:
        assert metric(runner.registry, "parcel") == 0
        runner.maintain()
        assert metric(runner.registry, "parcel") == 1
    finally:
        runner.close()
    assert timer(conn, "lost") == (T0 + 72 * H, False)
    assert conn.execute(count).fetchone() == (1,)  # "fine" is still open
    assert history(conn, "parcel") == [("lost", 1, True, True)]
    assert scan(db, rule, at + D) == 1  # "fine", paged; "lost" never again
    assert episodes(conn, "parcel") == [("fine", 1, 1), ("lost", 1, 1)]
    pruned = prune_events(db, [rule], FixedClock(at + 30 * D), retention=10 * D)
    assert pruned.timers == 1
    assert timer(conn, "lost") is None


def test_giving_up_reads_the_partial_indexes_not_the_table(conn: Conn) -> None:
    """On a shop's table of 50,000 orders (nearly all shipped) and a history of 50,000
    ended episodes, giving up reads the re-notify index, never the whole table, and
    finds the history's rows by their primary key."""
    from tests.integration.test_explain import big_shop, nodes

    rule = big_shop(conn, "inline")["order_unshipped"].model_copy(update={"give_up_after": 3 * D})
    plan = prepare(conn, rule)
    now = T0 + 30 * D
    conn.execute(
        "INSERT INTO slawatch.episode (rule, key, episode, deadline, due_at, notified_at,"
        " ended_at) SELECT 'order_unshipped', g::text, 1, t, t, t, CASE WHEN g > 10 THEN t END"
        " FROM generate_series(1, 50000) g, LATERAL (SELECT %s - g * interval '30 seconds') x(t)",
        (now - 4 * D,),
    )
    conn.execute("ANALYZE slawatch.episode")
    params = {
        "now": now,
        "rule": rule.name,
        "batch": 5000,
        "before_deadline": rule.cutoff(now - 3 * D),
    }
    statement = give_up_statement(plan, ["id"])
    with conn.transaction(force_rollback=True):
        (explained,) = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + statement.as_bytes(conn), params
        ).fetchone()  # type: ignore[misc]
    tree = nodes(explained[0]["Plan"])
    # (A bitmap index scan names its index, its heap scan the table.)
    assert {rule.again_index, "episode_pkey"} <= {n.get("Index Name") for n in tree}
    scanned = {n.get("Relation Name") for n in tree if n["Node Type"] == "Seq Scan"}
    assert not scanned & {"orders", "episode"}, tree
