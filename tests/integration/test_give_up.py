"""Rule ``give_up_after`` (README "Rules", "History and retention"): an episode still
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
from slawatch.engine.abandon import give_up
from slawatch.engine.claim import prepare
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


def next_time(conn: Conn, rule: Rule) -> object:
    if rule.track == "table":
        row = conn.execute(sql.SQL("SELECT sw_next FROM {}").format(state_table(rule))).fetchone()
    else:
        row = conn.execute(
            sql.SQL("SELECT {} FROM orders WHERE id = 1").format(sql.Identifier(rule.next_column))
        ).fetchone()
    assert row is not None
    return row[0]


def metric(registry: CollectorRegistry, rule: str) -> float | None:
    return registry.get_sample_value("slawatch_abandoned_total", {"rule": rule})


def test_a_row_that_stays_overdue_is_given_up_and_stops_renotifying(
    conn: Conn, db: Database, track: str
) -> None:
    """Renotify every 6 h without a max, give up after 3 days: re-notified until the
    episode is 3 days past due, then ended as abandoned (history, status) and never
    re-notified again; not a new episode while it stays overdue."""
    rule = shop(conn, track)["order_unshipped"].model_copy(
        update={
            "renotify": Renotify.model_validate({"every": "6h"}),
            "escalate": [],
            "give_up_after": 3 * D,
        }
    )
    plan = prepare(conn, rule)
    conn.execute("INSERT INTO orders VALUES (1, 7, 990, 'paid', %s)", (T0,))
    due = T0 + rule.after
    assert claim_all(conn, plan, due + S) == 1
    assert give_up(db, [plan], due + 3 * D - S) == {}  # not yet
    assert next_time(conn, rule) is not None
    assert give_up(db, [plan], due + 3 * D + S) == {"order_unshipped": 1}
    assert give_up(db, [plan], due + 3 * D + 2 * S) == {}  # once
    assert history(conn, "order_unshipped") == [("1", 1, True, True)]
    assert next_time(conn, rule) is None
    sent = len(episodes(conn, "order_unshipped"))
    for day in range(4, 30, 5):
        assert claim_all(conn, plan, due + day * D) == 0
    assert len(episodes(conn, "order_unshipped")) == sent
    (status,) = rule_status(conn, [rule], due + 30 * D)
    assert status.abandoned == 1


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
    assert [k for (k,) in conn.execute("SELECT key FROM slawatch.alert").fetchall()] == [
        "lost",
        "fine",
    ]
    pruned = prune_events(db, [rule], FixedClock(at + 30 * D), retention=10 * D)
    assert pruned.timers == 1
    assert timer(conn, "lost") is None
